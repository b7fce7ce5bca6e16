"""uvicorn's HTTP/1.1 protocol (h11) with two client-facing fixes.

Invariants:
- A malformed request that never reaches the app (bad chunk size, no Host header,
  a broken request line) gets the same `{"error": {"code", "message", "type"}}` body
  as every other error, not uvicorn's plain-text line.
- A client that sends a complete request and then half-closes its socket
  (`shutdown(SHUT_WR)`, as `curl` with some options and many scripts do) still gets
  its answer; the connection closes after it. A client that closes its socket
  while its request runs is still noticed within about half a second (interim
  responses probe it, `eof_received`), so its slot is freed. A client that
  half-closes in the middle of a request, or while idle, is disconnected as before.
"""
from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


class Protocol(H11Protocol):
    #: seconds between the interim responses that tell a closed peer from a half-closed one
    PROBE_DELAYS = (0.25, 0.25, 0.5, 1.0, 2.0)

    def eof_received(self) -> bool | None:
        """Keep the socket open for writing when a whole request has arrived (True);
        otherwise let asyncio close it (None).

        A FIN alone does not say whether the client closed its socket or only its
        sending side. A client that closed it resets the connection when written to, so
        until the response starts an HTTP/1.1 peer gets an interim `100 Continue` now
        and then (clients skip 1xx responses): the second write to a closed peer fails,
        the connection is lost and the request is cancelled as for any disconnect."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete or self.conn.their_state is not h11.DONE:
            return None
        cycle.keep_alive = False  # the client sends nothing more: close after the answer
        if self.conn.their_http_version == b"1.1":
            self.loop.call_later(self.PROBE_DELAYS[0], self._probe, cycle, 1)
        return True

    def _probe(self, cycle, n: int) -> None:
        if (self.transport.is_closing() or self.cycle is not cycle or cycle.response_started
                or cycle.response_complete):
            return
        self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        delay = self.PROBE_DELAYS[min(n, len(self.PROBE_DELAYS) - 1)]
        self.loop.call_later(delay, self._probe, cycle, n + 1)

    def send_400_response(self, msg: str) -> None:
        body = json.dumps({"error": {"code": 400, "message": msg,
                                     "type": "invalid_request_error"}}).encode()
        headers = [(b"content-type", b"application/json; charset=utf-8"),
                   (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
