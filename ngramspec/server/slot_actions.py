"""llama-server's slot actions and settings endpoints, and its context-shift request fields.

    POST /slots/{id}?action=save     {"filename": F}  -> id_slot, filename, n_saved, n_written, timings.save_ms
    POST /slots/{id}?action=restore  {"filename": F}  -> id_slot, filename, n_restored, n_read, timings.restore_ms
    POST /slots/{id}?action=erase                     -> id_slot, n_erased
    POST /props                                       -> {"success": true}

Slot actions need `--slot-save-path DIR` (else 501); F is a bare file name in DIR,
checked as llama.cpp checks it (`valid_filename`: no separators, no "..", no
control or reserved characters; else 400). A slot id wraps modulo the slot count,
as in llama-server. The action runs on the scheduler thread once the slot has
no request (`Scheduler.call`); the file format is `ngramspec.engine.slot_state`'s.

POST /props answers 501 unless the server runs with `--props`; llama-server then
accepts the body and changes nothing, and so does this server.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from fastapi import APIRouter, Request

from ..engine import slot_state
from ..settings import strict_json
from .errors import APIError

#: characters llama.cpp's fs_validate_filename refuses (besides control characters)
_FORBIDDEN = set(':*?"<>|/\\') | {"\uff0e", "\u2215", "\u2216", "\ufffd", "\ufeff"}


def valid_filename(name: Any) -> bool:
    """llama.cpp's fs_validate_filename (no sub-directories): a plain file name."""
    if not isinstance(name, str) or not 0 < len(name.encode("utf-8", "surrogatepass")) <= 255:
        return False
    for c in name:
        o = ord(c)
        if o <= 0x1F or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF or c in _FORBIDDEN:
            return False
    return not (name[0] == " " or name[-1] in " ." or ".." in name or name == ".")


def context_shift(settings, req) -> tuple[int, int] | None:
    """(n_keep, n_discard) of a request when the server shifts context, else None."""
    if not settings.context_shift:
        return None
    return (settings.keep if req.n_keep is None else req.n_keep), req.n_discard


async def _filename(request: Request) -> str:
    body = strict_json.loads(await request.body() or b"null", "JSON body")
    name = body.get("filename") if isinstance(body, dict) else None
    if name is None:
        raise APIError("missing required field 'filename'")
    if not valid_filename(name):
        raise APIError("Invalid filename")
    return name


def slot_actions_router(state, dependencies: list) -> APIRouter:
    """The routes above, on the app's ServerState (`state.settings`, `.scheduler`, `.engine`)."""
    router = APIRouter(dependencies=dependencies)

    async def on_slot(slot_id: int, fn) -> Any:
        return await asyncio.wrap_future(state.scheduler.call(slot_id, fn))

    @router.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request, action: str = ""):
        save_path = state.settings.slot_save_path
        if not save_path:
            raise APIError("This server does not support slots action. Start it with "
                           "`--slot-save-path`", "not_supported_error")
        try:
            slot = int(id_slot)
        except ValueError:
            raise APIError("Invalid slot ID") from None
        if slot < 0:
            raise APIError("Invalid slot ID")
        slot %= len(state.scheduler.slots)
        engine = state.engine
        if action == "erase":
            n = await on_slot(slot, lambda: slot_state.erase(engine, slot))
            return {"id_slot": slot, "n_erased": n}
        if action not in ("save", "restore"):
            raise APIError("Invalid action")
        name = await _filename(request)
        path = os.path.join(save_path, name)
        if action == "save":
            io = await on_slot(slot, lambda: slot_state.save(engine, slot, path))
            return {"id_slot": slot, "filename": name, "n_saved": io.n_tokens,
                    "n_written": io.n_bytes, "timings": {"save_ms": io.ms}}
        io = await on_slot(slot, lambda: slot_state.restore(engine, slot, path))
        return {"id_slot": slot, "filename": name, "n_restored": io.n_tokens,
                "n_read": io.n_bytes, "timings": {"restore_ms": io.ms}}

    @router.post("/props")
    async def set_props(request: Request):
        if not state.settings.props:
            raise APIError("This server does not support changing global properties. Start it "
                           "with `--props`", "not_supported_error")
        return {"success": True}

    return router
