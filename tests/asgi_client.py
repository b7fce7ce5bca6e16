"""One request to an ASGI app in-process (no server, no lifespan: the model never loads)."""
from __future__ import annotations

import asyncio

import httpx


def call(app, method: str, path: str, **kw) -> httpx.Response:
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.request(method, path, **kw)
    return asyncio.run(go())
