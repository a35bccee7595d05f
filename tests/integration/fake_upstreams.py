"""Scriptable fake upstreams on 127.0.0.1 for the router's integration tests: an OpenAI-compatible
server (vLLM/OpenAI stand-in) and an Anthropic Messages server. Each records what it received."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def client_left_within(request: Request, seconds: float) -> bool:
    """Wait `seconds` as a generating engine would; True if the client disconnected meanwhile
    (vLLM's OpenAI server watches for the disconnect and aborts the request the same way)."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    try:
        await asyncio.wait_for(gone(), seconds)
        return True
    except TimeoutError:
        return False


@dataclass
class Script:
    fail_times: int = 0  # answer 503 this many times first
    fail_status: int = 503
    stream_delay: float = 0.0  # seconds between streamed chunks
    reply_delay: float = 0.0  # seconds a non-streamed answer takes
    streams_cut: int = 0  # answers whose reader went away before the end (as vLLM aborts them)
    streams_done: int = 0  # streams sent to their end
    reply: str = "hello"
    cached_tokens: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


def openai_app(name: str, script: Script) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        script.received.append(body)
        script.headers.append(dict(request.headers))
        if script.fail_times > 0:
            script.fail_times -= 1
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=script.fail_status)
        reply = f"{script.reply} from {name}"
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": script.cached_tokens},
        }
        if body.get("stream"):

            async def gen() -> AsyncIterator[bytes]:
                base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
                for piece in reply.split(" "):
                    chunk = {
                        **base,
                        "choices": [{"index": 0, "delta": {"content": piece + " "}, "finish_reason": None}],
                    }
                    try:
                        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                        await asyncio.sleep(script.stream_delay)
                    except (asyncio.CancelledError, GeneratorExit):
                        script.streams_cut += 1  # what vLLM sees as an aborted request
                        raise
                yield (
                    b"data: "
                    + json.dumps({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode()
                    + b"\n\n"
                )
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
                script.streams_done += 1

            return StreamingResponse(gen(), media_type="text/event-stream")
        if script.reply_delay and await client_left_within(request, script.reply_delay):
            script.streams_cut += 1
            return Response(status_code=499)
        return JSONResponse(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                "usage": usage,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            }
        )

    async def completions(request: Request) -> Response:
        body = await request.json()
        script.received.append(body)
        return JSONResponse(
            {
                "id": "t1",
                "object": "text_completion",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "text": f"{script.reply} from {name}", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ]
    )


def anthropic_app(script: Script) -> Starlette:
    async def messages(request: Request) -> Response:
        body = await request.json()
        script.received.append(body)
        script.headers.append(dict(request.headers))
        usage = {
            "input_tokens": 7,
            "output_tokens": 2,
            "cache_read_input_tokens": script.cached_tokens,
            "cache_creation_input_tokens": 0,
        }
        if body.get("stream"):

            async def gen() -> AsyncIterator[bytes]:
                events = [
                    (
                        "message_start",
                        {"type": "message_start", "message": {"id": "msg_1", "model": body["model"], "usage": usage}},
                    ),
                    (
                        "content_block_start",
                        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": "bonjour "},
                        },
                    ),
                    (
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": 0,
                            "delta": {"type": "text_delta", "text": "anthropic"},
                        },
                    ),
                    (
                        "message_delta",
                        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
                    ),
                    ("message_stop", {"type": "message_stop"}),
                ]
                for name, data in events:
                    yield f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": [{"type": "text", "text": "bonjour anthropic"}],
                "stop_reason": "end_turn",
                "usage": usage,
            }
        )

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])


class Server:
    """A uvicorn server in a background thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
