"""A fake provider that misbehaves in every way the router must survive, picked by the model id the
router sends (one upstream per behaviour, all at this one server): answers that are valid JSON but
no completion, invalid JSON, HTML, 5xx, hangs, streams that are cut, malformed, end early or carry
an error, for the OpenAI-compatible API and the Anthropic Messages API alike. It counts calls per
behaviour, so tests can see retries and failovers."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

OK_ANSWER = {"id": "c1", "object": "chat.completion", "created": 1, "model": "ok",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine"}, "finish_reason": "stop"}],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}

# Non-streamed answers: the body bytes (status 200, application/json unless said otherwise).
BODIES: dict[str, tuple[int, str, bytes]] = {
    "listjson": (200, "application/json", b"[1, 2, 3]"),
    "nulljson": (200, "application/json", b"null"),
    "stringjson": (200, "application/json", b'"an answer"'),
    "numberjson": (200, "application/json", b"42"),
    "nochoices": (200, "application/json", b'{"id": "c1", "object": "chat.completion"}'),
    "choicesnotlist": (200, "application/json", b'{"id": "c1", "choices": "fine"}'),
    "emptychoices": (200, "application/json", b'{"id": "c1", "choices": []}'),
    "choicenotobject": (200, "application/json", b'{"id": "c1", "choices": [1]}'),
    "nanjson": (200, "application/json", json.dumps({**OK_ANSWER, "x": float("nan")}).encode()),
    "surrogatejson": (200, "application/json", json.dumps(OK_ANSWER).replace("fine", "\\ud800").encode()),
    "deepjson": (200, "application/json", b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "badjson": (200, "application/json", b"{not json"),
    "html200": (200, "text/html", b"<html><body>Welcome to nginx!</body></html>"),
    "empty200": (200, "application/json", b""),
    "html502": (502, "text/html", b"<html><body>502 Bad Gateway</body></html>"),
    "e500": (500, "application/json", b'{"error": {"message": "boom"}}'),
    "badusage": (200, "application/json", json.dumps({**OK_ANSWER, "usage": "lots"}).encode()),
    # Refusals (the timeouts and API-fidelity tests cover their policy; the sweep, that none is a 500):
    "e429": (429, "application/json", b'{"error": {"message": "slow down"}}'),
    "e401": (401, "application/json", b'{"error": {"message": "Incorrect API key provided: sk-up***"}}'),
    "e400ctx": (400, "application/json", b'{"error": {"message": "This model\'s maximum context length is 8192"}}'),
    "e400": (400, "application/json", b'{"error": {"message": "bad temperature"}}'),
    "e404html": (404, "text/html", b"<html><body>Not Found</body></html>"),
}
HEADERS = {"e429": {"retry-after": "30"}}  # longer than the router waits out: escalated or relayed at once


def _chunk(content: str | None = None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    c = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(c).encode() + b"\n\n"


GOOD_STREAM = [_chunk("fi"), _chunk("ne"), _chunk(finish="stop"), b"data: [DONE]\n\n"]
# Streams: the events sent; `CUT` raises (the connection drops without the chunked terminator).
CUT = b"\x00cut"
STREAMS: dict[str, list[bytes]] = {
    "ok": GOOD_STREAM,
    "crlfsse": [e.replace(b"\n", b"\r\n") for e in GOOD_STREAM],
    "splitsse": [b"".join(GOOD_STREAM)[i:i + 7] for i in range(0, len(b"".join(GOOD_STREAM)), 7)],
    "cutstream": [_chunk("fi"), CUT],
    "endstream": [_chunk("fi"), _chunk("ne")],  # ends cleanly, but without [DONE]
    "badsse": [_chunk("fi"), b"data: {not json\n\n", _chunk("ne"), b"data: [DONE]\n\n"],
    "listsse": [_chunk("fi"), b"data: [1, 2]\n\n", b"data: [DONE]\n\n"],
    "nansse": [_chunk("fi"), b'data: {"choices": [], "x": NaN}\n\n', b"data: [DONE]\n\n"],
    "errorsse": [_chunk("fi"), b'data: {"error": {"message": "engine died", "code": 500}}\n\n'],
    "emptydatasse": [_chunk("fi"), b"data:\n\n", b"data: [DONE]\n\n"],
    "html200": [b"<html><body>Welcome to nginx!</body></html>"],
    "nulljson": [b"null"],
}


def _anthropic(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


A_START = _anthropic("message_start", {"type": "message_start", "message": {"id": "m1", "model": "a", "usage": {
    "input_tokens": 3, "output_tokens": 0}}})
A_TEXT = _anthropic("content_block_delta", {"type": "content_block_delta", "index": 0,
                                            "delta": {"type": "text_delta", "text": "fine"}})
A_END = [_anthropic("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                      "usage": {"output_tokens": 1}}),
         _anthropic("message_stop", {"type": "message_stop"})]
A_STREAMS: dict[str, list[bytes]] = {
    "a-ok": [A_START, A_TEXT, *A_END],
    "a-badsse": [A_START, A_TEXT, b"event: content_block_delta\ndata: {not json\n\n", *A_END],
    "a-listsse": [A_START, A_TEXT, b"event: content_block_delta\ndata: [1]\n\n", *A_END],
    "a-oddsse": [A_START, _anthropic("content_block_delta", {"type": "content_block_delta", "delta": "x"}), *A_END],
    "a-error": [A_START, A_TEXT, _anthropic("error", {"type": "error", "error": {"type": "overloaded_error",
                                                                                 "message": "Overloaded"}})],
    "a-cut": [A_START, A_TEXT, CUT],
    "a-end": [A_START, A_TEXT],  # no message_stop
}
A_BODIES: dict[str, bytes] = {
    "a-ok": json.dumps({"id": "m1", "type": "message", "role": "assistant", "model": "a",
                        "content": [{"type": "text", "text": "fine"}], "stop_reason": "end_turn",
                        "usage": {"input_tokens": 3, "output_tokens": 1}}).encode(),
    "a-listjson": b"[1, 2]",
    "a-nulljson": b"null",
    "a-contentstring": b'{"id": "m1", "content": "fine", "stop_reason": "end_turn"}',
    "a-contentnumbers": b'{"id": "m1", "content": [1, 2], "stop_reason": "end_turn"}',
    "a-usagebad": b'{"id": "m1", "content": [], "usage": {"input_tokens": "many"}}',
    "a-nanjson": b'{"id": "m1", "content": [{"type": "text", "text": "x"}], "usage": {"input_tokens": NaN}}',
}


class Misbehaving:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self.openai, methods=["POST"]),
            Route("/v1/completions", self.openai, methods=["POST"]),
            Route("/v1/messages", self.anthropic, methods=["POST"]),
        ])

    async def openai(self, request: Request) -> Response:
        body = await request.json()
        model = body.get("model", "")
        self.calls[model] += 1
        if model == "hang":  # until the router gives up and closes the connection (so shutdown is quick)
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return Response(status_code=499)
        if body.get("stream") and model in STREAMS:
            return StreamingResponse(_send(STREAMS[model]), media_type="text/event-stream")
        if model in BODIES:
            status, ctype, raw = BODIES[model]
            return Response(raw, status_code=status, media_type=ctype, headers=HEADERS.get(model))
        if body.get("stream"):
            return StreamingResponse(_send(GOOD_STREAM), media_type="text/event-stream")
        return JSONResponse(OK_ANSWER)

    async def anthropic(self, request: Request) -> Response:
        body = await request.json()
        model = body.get("model", "")
        self.calls[model] += 1
        if body.get("stream"):
            return StreamingResponse(_send(A_STREAMS.get(model, A_STREAMS["a-ok"])), media_type="text/event-stream")
        return Response(A_BODIES.get(model, A_BODIES["a-ok"]), media_type="application/json")


async def _send(events: list[bytes]) -> AsyncIterator[bytes]:
    for e in events:
        if e == CUT:
            raise ConnectionAbortedError("the fake provider drops the connection mid-stream")
        yield e
        await asyncio.sleep(0)


def upstreams(url: str) -> list[dict[str, Any]]:
    """One router upstream per behaviour, named after it."""
    names = sorted({"ok", "hang", *BODIES, *STREAMS})
    ups: list[dict[str, Any]] = [{"name": n, "provider": "vllm", "base_url": url + "/v1", "model": n} for n in names]
    for up in ups:
        if up["name"] == "hang":
            up["timeout_seconds"] = 0.3
    ups += [{"name": n, "provider": "anthropic", "base_url": url + "/v1", "model": n,
             "api_key_env": "OCULIS_TEST_ANTHROPIC_KEY"} for n in sorted({*A_STREAMS, *A_BODIES})]
    return ups
