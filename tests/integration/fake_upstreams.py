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
from time_scale import Deadline


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
    anthropic_text: str = "bonjour anthropic"  # the Anthropic fake's whole answer (the verifier tests: a grade)
    cached_tokens: int = 0
    cache_written_tokens: int = 0  # Anthropic's cache_creation_input_tokens
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    # Opt-in answers that depend on the request, as a real model's do (the cache-fidelity tests):
    echo_question: bool = False  # reply "answer to <last user message or prompt> (<calls so far>)"
    call_tools: bool = False  # a request with `tools` is answered with a call of the first one
    give_logprobs: bool = False  # a request with `logprobs` gets one logprob per reply word
    logprob: float = -0.5  # ... of this value (the answer-escalation tests: how sure the model was)
    # Upstream behaviours for the timeout and retry tests:
    fail_headers: dict[str, str] = field(default_factory=dict)  # sent with the failures (e.g. Retry-After)
    fail_body: dict[str, Any] | None = None  # the failures' body (default: {"error": {"message": "overloaded"}})
    first_chunk_delay: float = 0.0  # a stream's headers go at once, its first chunk after this
    stall_after: int = 0  # a stream goes silent for stall_seconds after this many chunks (0: never)
    stall_seconds: float = 0.0
    body_stall: float = 0.0  # a non-streamed answer sends its headers and half its body, then waits this long
    reply_raw: bytes | None = None  # a non-streamed answer's exact body (e.g. valid JSON that is no object)
    no_usage: bool = False  # an engine that reports no usage (no `usage` field, no usage chunk when asked)


def question_of(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return str(body["prompt"])
    users = [m.get("content") for m in body.get("messages", []) if m.get("role") == "user"]
    return str(users[-1]) if users else ""


def answer_parts(script: Script, name: str, body: dict[str, Any]) -> tuple[str, dict[str, Any] | None, bool]:
    """The reply text, a tool call (or None) and whether logprobs go with it."""
    reply = f"{script.reply} from {name}"
    if script.echo_question:
        reply = f"answer to {question_of(body)!r} ({len(script.received)})"
    call = None
    if script.call_tools and body.get("tools"):
        fn = body["tools"][0]["function"]["name"]
        call = {"id": f"call_{len(script.received)}", "type": "function",
                "function": {"name": fn, "arguments": '{"city": "Paris"}'}}
    return reply, call, bool(script.give_logprobs and body.get("logprobs"))


def word_logprobs(words: list[str], value: float = -0.5) -> list[dict[str, Any]]:
    return [{"token": w, "logprob": value, "bytes": list(w.encode()), "top_logprobs": []} for w in words]


def openai_app(name: str, script: Script) -> Starlette:
    async def chat(request: Request) -> Response:
        body = await request.json()
        script.received.append(body)
        script.headers.append(dict(request.headers))
        if script.fail_times > 0:
            script.fail_times -= 1
            return JSONResponse(script.fail_body or {"error": {"message": "overloaded"}},
                                status_code=script.fail_status, headers=script.fail_headers)
        reply, call, with_logprobs = answer_parts(script, name, body)
        usage = {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "total_tokens": 13,
            "prompt_tokens_details": {"cached_tokens": script.cached_tokens},
        }
        if body.get("stream"):

            async def gen() -> AsyncIterator[bytes]:
                await asyncio.sleep(script.first_chunk_delay)
                sent = 0
                base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
                if call:  # as OpenAI streams a call: id and name first, then the arguments in pieces
                    args = call["function"]["arguments"]
                    for d in ({**call, "function": {"name": call["function"]["name"], "arguments": ""}},
                              {"function": {"arguments": args[:5]}}, {"function": {"arguments": args[5:]}}):
                        delta: dict[str, Any] = {"role": "assistant", "content": None} if "id" in d else {}
                        delta["tool_calls"] = [{"index": 0, **d}]
                        yield b"data: " + json.dumps({**base, "choices": [
                            {"index": 0, "delta": delta, "finish_reason": None}]}).encode() + b"\n\n"
                for piece, index in [] if call else [(p, i) for p in reply.split(" ") for i in range(body.get("n", 1))]:
                    chunk = {
                        **base,
                        "choices": [{"index": index, "delta": {"content": piece + " "}, "finish_reason": None}],
                    }
                    if with_logprobs:
                        chunk["choices"][0]["logprobs"] = {"content": word_logprobs([piece + " "], script.logprob)}
                    try:
                        yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                        await asyncio.sleep(script.stream_delay)
                        sent += 1
                        if sent == script.stall_after:
                            await asyncio.sleep(script.stall_seconds)
                    except (asyncio.CancelledError, GeneratorExit):
                        script.streams_cut += 1  # what vLLM sees as an aborted request
                        raise
                for index in range(body.get("n", 1)):
                    end = {"index": index, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}
                    yield b"data: " + json.dumps({**base, "choices": [end]}).encode() + b"\n\n"
                if (body.get("stream_options") or {}).get("include_usage") and not script.no_usage:
                    yield b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"
                script.streams_done += 1

            return StreamingResponse(gen(), media_type="text/event-stream")
        if script.reply_delay and await client_left_within(request, script.reply_delay):
            script.streams_cut += 1
            return Response(status_code=499)
        if script.reply_raw is not None:
            return Response(script.reply_raw, media_type="application/json")
        if script.body_stall:

            async def halves() -> AsyncIterator[bytes]:
                yield b'{"id": "c1", '
                await asyncio.sleep(script.body_stall)
                yield b'"object": "chat.completion", "choices": []}'

            return StreamingResponse(halves(), media_type="application/json")
        return JSONResponse(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body["model"],
                **({} if script.no_usage else {"usage": usage}),
                "choices": [
                    {
                        "index": index,
                        "message": {"role": "assistant", "content": None, "tool_calls": [call]}
                        if call
                        else {"role": "assistant", "content": reply},
                        "finish_reason": "tool_calls" if call else "stop",
                        **({"logprobs": {"content": word_logprobs(reply.split(" "), script.logprob)}}
                           if with_logprobs else {}),
                    }
                    for index in range(body.get("n", 1))  # as vLLM and OpenAI answer `n` choices
                ],
            }
        )

    async def completions(request: Request) -> Response:
        body = await request.json()
        script.received.append(body)
        text, _, with_logprobs = answer_parts(script, name, body)
        if body.get("echo"):
            text = str(body.get("prompt")) + text
        usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}

        def logprobs(words: list[str]) -> dict[str, Any] | None:
            if not with_logprobs:
                return None
            return {"tokens": words, "token_logprobs": [script.logprob] * len(words),
                    "top_logprobs": [None] * len(words), "text_offset": list(range(len(words)))}

        if body.get("stream"):  # text_completion chunks, as vLLM and OpenAI stream them

            async def gen() -> AsyncIterator[bytes]:
                base = {"id": "t1", "object": "text_completion", "created": 1, "model": body["model"]}
                words = [w + " " for w in text.split(" ")]
                for w in words:
                    choice = {"index": 0, "text": w, "logprobs": logprobs([w]), "finish_reason": None}
                    yield b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"
                end = {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
                yield b"data: " + json.dumps({**base, "choices": [end]}).encode() + b"\n\n"
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield b"data: " + json.dumps({**base, "choices": [], "usage": usage}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        choice = {"index": 0, "text": text, "finish_reason": "stop"}
        if with_logprobs:
            choice["logprobs"] = logprobs(text.split(" "))
        return JSONResponse(
            {
                "id": "t1",
                "object": "text_completion",
                "created": 1,
                "model": body["model"],
                "choices": [choice],
                "usage": usage,
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
            "cache_creation_input_tokens": script.cache_written_tokens,
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
                "content": [{"type": "text", "text": script.anthropic_text}],
                "stop_reason": "end_turn",
                "usage": usage,
            }
        )

    return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])

# ---- API fidelity fakes: what the router forwards, and answers with tool calls and headers ----------

REQUEST_HEADERS = {"x-request-id": "req-fake-1", "x-ratelimit-remaining-requests": "99",
                   "x-ratelimit-limit-tokens": "30000", "anthropic-ratelimit-requests-remaining": "49"}


@dataclass
class Recorder:
    """What a fidelity fake received, and how it answers."""

    received: list[dict[str, Any]] = field(default_factory=list)
    tool_use: dict[str, Any] | None = None  # Anthropic: answer a request with tools by this call {name, input}
    html_error: int = 0  # OpenAI: answer with this status and an HTML page (as a proxy in front might)


def fidelity_openai_app(rec: Recorder) -> Starlette:
    """Echoes nothing: records the body, answers with a request id and rate-limit headers."""

    async def endpoint(request: Request) -> Response:
        body = await request.json()
        rec.received.append(body)
        if rec.html_error:
            return Response(b"<html><body>404 Not Found</body></html>", status_code=rec.html_error,
                            media_type="text/html", headers=REQUEST_HEADERS)
        base = {"id": "c1", "created": 1, "model": body.get("model")}
        if body.get("stream"):
            async def gen() -> AsyncIterator[bytes]:
                for delta, finish in (({"role": "assistant", "content": "ok"}, None), ({}, "stop")):
                    chunk = {**base, "object": "chat.completion.chunk",
                             "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                    yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream", headers=REQUEST_HEADERS)
        if "prompt" in body:
            return JSONResponse({**base, "object": "text_completion",
                                 "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]},
                                headers=REQUEST_HEADERS)
        return JSONResponse({**base, "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]},
            headers=REQUEST_HEADERS)

    return Starlette(routes=[Route("/v1/chat/completions", endpoint, methods=["POST"]),
                             Route("/v1/completions", endpoint, methods=["POST"])])


def fidelity_anthropic_app(rec: Recorder) -> Starlette:
    """A Messages API that records the request and, given tools, answers with text and a tool_use
    block, streamed (content blocks with input_json_delta pieces) or not."""

    async def messages(request: Request) -> Response:
        body = await request.json()
        rec.received.append(body)
        call = rec.tool_use if body.get("tools") else None
        usage = {"input_tokens": 5, "output_tokens": 4}
        stop = "tool_use" if call else "end_turn"
        if not body.get("stream"):
            content: list[dict[str, Any]] = [{"type": "text", "text": "Let me check."}]
            if call:
                content.append({"type": "tool_use", "id": "toolu_1", "name": call["name"], "input": call["input"]})
            return JSONResponse({"id": "msg_f", "type": "message", "role": "assistant", "model": body["model"],
                                 "content": content, "stop_reason": stop, "usage": usage}, headers=REQUEST_HEADERS)

        def ev(data: dict[str, Any]) -> bytes:
            return f"event: {data['type']}\ndata: {json.dumps(data)}\n\n".encode()

        async def gen() -> AsyncIterator[bytes]:
            yield ev({"type": "message_start", "message": {"id": "msg_f", "model": body["model"], "usage": usage}})
            yield ev({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            yield ev({"type": "ping"})
            yield ev({"type": "content_block_delta", "index": 0,
                      "delta": {"type": "text_delta", "text": "Let me check."}})
            yield ev({"type": "content_block_stop", "index": 0})
            if call:
                yield ev({"type": "content_block_start", "index": 1, "content_block": {
                    "type": "tool_use", "id": "toolu_1", "name": call["name"], "input": {}}})
                args = json.dumps(call["input"])
                for piece in (args[:4], args[4:]):
                    yield ev({"type": "content_block_delta", "index": 1,
                              "delta": {"type": "input_json_delta", "partial_json": piece}})
                yield ev({"type": "content_block_stop", "index": 1})
            yield ev({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 4}})
            yield ev({"type": "message_stop"})

        return StreamingResponse(gen(), media_type="text/event-stream", headers=REQUEST_HEADERS)

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
        deadline = Deadline(10)
        while not self.server.started and not deadline.expired():
            time.sleep(0.02)
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
