"""What a client sent: its body, read within limits and checked as the OpenAI API would, who it is
from (the tenant), and whether it is still there."""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

from starlette.requests import Request

from oculis_router import strictjson
from oculis_router.errors import APIError, bad_request


def tenant_of(request: Request) -> str:
    """The cache partition of a request: its API key (as a digest: the key itself is never kept or
    logged), subdivided by `X-Oculis-Tenant` when a gateway in front sets it. The header alone never
    decides: any client can send any header, so naming another tenant must not reach its answers."""
    auth = request.headers.get("authorization", "")
    key = "key-" + hashlib.sha256(auth.encode()).hexdigest()[:16] if auth else "anonymous"
    explicit = request.headers.get("x-oculis-tenant")
    return f"{key}/{explicit}" if explicit else key


async def read_body(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes "
                       "(server.max_body_bytes)", code="request_too_large")
    # Read as it arrives and stop at the limit: a chunked body declares no length, and buffering it
    # whole first let one request hold any amount of memory. The rest is discarded by the server.
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes (server.max_body_bytes)",
                           code="request_too_large")
        parts.append(part)
    try:
        body = strictjson.loads(b"".join(parts), "the request body")
    except ValueError as exc:  # invalid JSON or UTF-8, NaN/Infinity, lone surrogates, nesting too deep
        raise bad_request(str(exc), code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def check_headers(raw: list[tuple[bytes, bytes]], limit: int) -> None:
    """The request's headers within `server.max_header_bytes` (the HTTP parser sets no bound of its
    own): a 431 that says so, not a request whose headers are carried, logged and relayed."""
    size = sum(len(k) + len(v) + 4 for k, v in raw)  # ": " and CRLF, as on the wire
    if size > limit:
        raise APIError(431, f"request headers of {size} bytes exceed the limit of {limit} bytes "
                       "(server.max_header_bytes); send fewer or shorter headers", code="request_headers_too_large")


MAX_CHOICES = 128  # OpenAI's own bound on `n`


def _json_type(value: Any) -> str:
    return {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}.get(type(value),
                                                                                              type(value).__name__)


def check_body(body: dict[str, Any], endpoint: str, max_messages: int = 2048) -> dict[str, Any]:
    """The request as the router will use it, checked for what the router itself needs. Fields it
    does not know pass through: OpenAI-compatible engines take extensions (vLLM's `top_k`,
    `guided_json`, `repetition_penalty`...) and OpenAI adds fields often; a provider that cannot take
    a field refuses it by name (providers/anthropic.py). A top-level `null` means "unset", as some
    clients send it, so it is dropped rather than judged or forwarded."""
    body = {k: v for k, v in body.items() if v is not None}
    model = body.get("model")
    if model is not None and not isinstance(model, str):  # given, but not a name (QA3 Part 2 #18)
        raise bad_request(f"`model` must be a string, a route or upstream name (see GET /v1/models); got a JSON "
                          f"{_json_type(model)}", param="model")
    if not model:
        raise bad_request("you must provide a model: a route or upstream name (see GET /v1/models)", param="model")
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad_request("`messages` is required: a non-empty list of {role, content}", param="messages")
        if len(msgs) > max_messages:
            raise bad_request(f"`messages` has {len(msgs)} messages, more than the limit of {max_messages} "
                              "(server.max_messages); shorten the conversation", param="messages",
                              code="too_many_messages")
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
            raise bad_request("each message needs a string `role`", param="messages")
    elif not isinstance(body.get("prompt"), str | list):
        raise bad_request("`prompt` is required: a string or a list of strings", param="prompt")
    n = body.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise bad_request(f"`n` must be a whole number of choices from 1 to {MAX_CHOICES} (got {n!r})", param="n")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise bad_request("`stream` must be a boolean", param="stream")
    return body


async def disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read, so only a disconnect can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def check_client_key(request: Request, keys_env: str | None) -> None:
    """With `server.client_keys_env` set, the request's bearer key must be one of the listed keys
    (compared in constant time). Fails closed: an empty or missing variable refuses everyone."""
    if not keys_env:
        return
    accepted = [k.strip() for k in os.environ.get(keys_env, "").split(",") if k.strip()]
    auth = request.headers.get("authorization", "")
    given = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    if not given or not any(hmac.compare_digest(given.encode(), k.encode()) for k in accepted):
        raise APIError(401, "invalid or missing API key: send `Authorization: Bearer <key>` with a key this "
                            "router accepts", type_="invalid_request_error", code="invalid_api_key")


class HeaderLimit:
    """ASGI middleware: every HTTP request's headers checked against the current config's
    `server.max_header_bytes` before any endpoint (or the 404 handler) sees them."""

    def __init__(self, app: Any, limit: Any) -> None:
        self.app, self.limit = app, limit  # limit: () -> int, read per request (the config reloads)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            try:
                check_headers(scope["headers"], self.limit())
            except APIError as err:
                await err.response(headers={"connection": "close"})(scope, receive, send)
                return
        await self.app(scope, receive, send)
