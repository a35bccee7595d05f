"""`--api-key` as vLLM 0.32 applies it (vllm/entrypoints/serve/middleware/authenticate.py): with keys
given (`--api-key K ...`, else the VLLM_API_KEY environment variable), every request under /v1, /v2,
/inference or /cohere without `Authorization: Bearer <one of them>` gets 401 {"error": "Unauthorized"};
OPTIONS and every other path (/health, /metrics, /version) stay open. So the sandbox's engine pods refuse
what a real engine refuses, adapter loading included."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable

from aiohttp import web

GUARDED_PREFIX = ("/v1", "/v2", "/inference", "/cohere")
KEY_ENV = "VLLM_API_KEY"


def keys_from(flag: list[str] | None) -> list[str]:
    """The flag's keys take precedence over the environment's, as in vLLM."""
    return [k for k in (flag or [os.environ.get(KEY_ENV) or ""]) if k]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def middleware(keys: list[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    wanted = [_digest(k) for k in keys]

    def allowed(header: str | None) -> bool:
        scheme, _, param = (header or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        got = _digest(param)
        ok = False
        for want in wanted:  # every comparison made, as vLLM does: no early exit on a match
            ok |= secrets.compare_digest(got, want)
        return ok

    @web.middleware
    async def authenticate(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
        if (request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIX)
                and not allowed(request.headers.get("Authorization"))):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return authenticate
