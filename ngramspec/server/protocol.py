"""uvicorn's HTTP/1.1 protocol (h11) with two client-facing fixes.

Invariants:
- A malformed request that never reaches the app (bad chunk size, no Host header,
  a broken request line) gets the same `{"error": {"code", "message", "type"}}` body
  as every other error, not uvicorn's plain-text line.
- A client that sends a complete request and then half-closes its socket
  (`shutdown(SHUT_WR)`, as `curl` with some options and many scripts do) still gets
  its answer; the connection closes after it. A client that half-closes in the
  middle of a request, or while idle, is disconnected as before.
"""
from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class Protocol(H11Protocol):
    def eof_received(self) -> bool | None:
        """Keep the socket open for writing when a whole request has arrived (True);
        otherwise let asyncio close it (None)."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.conn.their_state is not h11.DONE:
            return None
        cycle.keep_alive = False  # the client sends nothing more: close after the answer
        return True

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": {"code": 400, "message": msg,
                                     "type": "invalid_request_error"}}).encode()
        headers = [(b"content-type", b"application/json; charset=utf-8"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
