"""Server-sent events of OpenAI answers, both ways: a stream read on the side while it is relayed is
rebuilt into the answer a non-streamed request would have got (`StreamCollector`, for usage and the
cache), and a whole answer is cut into the chunks a stream would have carried (`chunks_of`, to replay
a cached answer as a stream).

Both endpoints: `chat` (`chat.completion` / `chat.completion.chunk`, with tool-call deltas merged by
index) and `completions` (`text_completion` objects and chunks). Whatever a chunk carries that the
rebuild does not know how to keep (an unknown structured field, an error event, JSON that does not
parse) marks the rebuild unfaithful instead of being dropped silently; the cache then leaves it out.
"""

from __future__ import annotations

import json
import re
from typing import Any

ANSWER_OBJECT = {"chat": "chat.completion", "completions": "text_completion"}
CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completions": "text_completion"}
# Top-level fields that are the same in every chunk and in the whole answer.
META = ("id", "created", "model", "system_fingerprint", "service_tier")
# OpenAI pads chunks with random-length `obfuscation` text against length side channels: not part of
# the answer, and the non-streamed answer has none.
PADDING = ("obfuscation",)
# Choice fields that say why generation ended; the last non-null one wins (vLLM adds `stop_reason`,
# the matched stop string or token).
ENDINGS = ("finish_reason", "stop_reason")


class StreamCollector:
    """Rebuilds the whole answer of one endpoint from its SSE chunks, fed in any pieces."""

    def __init__(self, endpoint: str = "chat") -> None:
        self.endpoint = endpoint
        self._buf = b""
        self.usage: dict[str, Any] | None = None
        self.meta: dict[str, Any] = {}
        self.complete = False  # the stream reached `data: [DONE]`
        self.faithful = True  # False once a chunk carried something the rebuilt answer would lose
        self._choices: dict[int, dict[str, Any]] = {}
        self._calls: dict[int, dict[int, dict[str, Any]]] = {}  # choice index -> tool call index -> call

    def feed(self, data: bytes) -> None:
        # SSE allows CRLF line ends; normalised on the whole buffer so a CR and LF split across feeds still pair up.
        self._buf = (self._buf + data).replace(b"\r\n", b"\n")
        while b"\n\n" in self._buf:
            event, self._buf = self._buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # comments (keep-alives), `event:` and `id:` lines carry no answer
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.complete = True
                    continue
                try:
                    chunk = json.loads(payload)
                except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                    self.faithful = False
                    continue
                if isinstance(chunk, dict):
                    self._take(chunk)
                else:
                    self.faithful = False

    def _take(self, chunk: dict[str, Any]) -> None:
        for k, v in chunk.items():
            if k == "usage":
                if v:
                    self.usage = v
            elif k in META:
                if v is not None:
                    self.meta[k] = v
            elif k in ("object", "choices", *PADDING):
                continue
            elif v is not None:
                self.faithful = False  # e.g. an `error` event mid-stream
        choices = chunk.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            self.faithful = False
            return
        for choice in choices:
            index = choice.get("index", 0) if isinstance(choice, dict) else None
            if not isinstance(index, int):
                self.faithful = False
                continue
            self._take_choice(index, choice)

    def _take_choice(self, index: int, choice: dict[str, Any]) -> None:
        acc = self._choices.setdefault(index, {"index": index})
        for k, v in choice.items():
            if k == "index" or v is None:
                continue
            if k in ENDINGS:
                acc[k] = v
            elif k == "logprobs":
                self._take_logprobs(acc, v)
            elif k == "delta" and self.endpoint == "chat" and isinstance(v, dict):
                self._take_delta(index, acc.setdefault("message", {}), v)
            elif k == "text" and self.endpoint == "completions" and isinstance(v, str):
                acc["text"] = acc.get("text", "") + v
            else:
                self.faithful = False

    def _take_logprobs(self, acc: dict[str, Any], logprobs: Any) -> None:
        """Chat (`content`, `refusal`) and legacy completions (`tokens`, `token_logprobs`,
        `top_logprobs`, `text_offset`) logprobs alike are lists per token: concatenated."""
        if not isinstance(logprobs, dict):
            self.faithful = False
            return
        merged = acc.setdefault("logprobs", {})
        for k, v in logprobs.items():
            if isinstance(v, list):
                merged[k] = merged.get(k, []) + v
            elif v is not None:
                self.faithful = False

    def _take_delta(self, index: int, msg: dict[str, Any], delta: dict[str, Any]) -> None:
        for k, v in delta.items():
            if v is None:
                continue
            if k == "tool_calls" and isinstance(v, list):
                self._take_tool_calls(self._calls.setdefault(index, {}), v)
            elif k == "function_call" and isinstance(v, dict):  # the legacy single call
                self._take_function(msg.setdefault("function_call", {}), v)
            elif k == "role" and isinstance(v, str):
                msg["role"] = v
            elif isinstance(v, str):  # content, refusal, reasoning_content...: text streamed in pieces
                msg[k] = msg.get(k, "") + v
            else:
                self.faithful = False

    def _take_tool_calls(self, calls: dict[int, dict[str, Any]], deltas: list[Any]) -> None:
        """A call's first delta brings its id, type and name; later ones append to its arguments."""
        for d in deltas:
            index = d.get("index", 0) if isinstance(d, dict) else None
            if not isinstance(index, int):
                self.faithful = False
                continue
            call = calls.setdefault(index, {})
            for k, v in d.items():
                if k == "index" or v is None:
                    continue
                if k in ("id", "type") and isinstance(v, str):
                    call.setdefault(k, v)
                elif k == "function" and isinstance(v, dict):
                    self._take_function(call.setdefault("function", {}), v)
                else:
                    self.faithful = False

    def _take_function(self, fn: dict[str, Any], delta: dict[str, Any]) -> None:
        for k, v in delta.items():
            if v is None:
                continue
            if k in ("name", "arguments") and isinstance(v, str):
                fn[k] = fn.get(k, "") + v
            else:
                self.faithful = False

    def generated_text(self) -> str:
        """Everything generated so far, in every choice (text, tool calls), whole or cut: what an
        answer without usage is metered by (relay.estimated_usage)."""
        parts: list[str] = []
        for index, acc in self._choices.items():
            parts += [v for k, v in acc.get("message", {}).items() if k != "role" and isinstance(v, str)]
            parts += [acc["text"]] if isinstance(acc.get("text"), str) else []
            parts += [_function_text(c.get("function")) for c in self._calls.get(index, {}).values()]
        return "\n".join(p for p in parts if p)

    def response(self) -> dict[str, Any] | None:
        """The answer a non-streamed request would have got, or None when this stream cannot stand for
        it: unfinished, a chunk the rebuild would lose, no choices, or no usage chunk (the router always
        asks the upstream for one; a non-streamed answer always carries usage)."""
        if not (self.complete and self.faithful and self._choices and self.usage):
            return None
        choices = []
        for index in sorted(self._choices):
            acc = self._choices[index]
            choice: dict[str, Any] = {"index": index}
            if self.endpoint == "chat":
                msg = acc.get("message", {})
                message = {"role": msg.get("role", "assistant"), "content": msg.get("content"),
                           **{k: v for k, v in msg.items() if k not in ("role", "content")}}
                calls = self._calls.get(index)
                if calls:
                    message["tool_calls"] = [calls[i] for i in sorted(calls)]
                choice["message"] = message
            else:
                choice["text"] = acc.get("text", "")
            choice["logprobs"] = acc.get("logprobs")
            for k in ENDINGS:
                if k in acc or k == "finish_reason":
                    choice[k] = acc.get(k)
            choices.append(choice)
        return {**self.meta, "object": ANSWER_OBJECT[self.endpoint], "choices": choices, "usage": self.usage}


def chunks_of(answer: dict[str, Any], endpoint: str = "chat", include_usage: bool = True) -> list[dict[str, Any]]:
    """The chunks a stream of `answer` carries: per choice its text (with its logprobs), each tool call
    whole, the finish reason; then the usage chunk when the request wants one. Fields a stream has no
    place for are not carried: `cache.storable` refuses answers that have any."""
    base = {"id": answer.get("id"), "object": CHUNK_OBJECT[endpoint], "created": answer.get("created"),
            "model": answer.get("model"),
            **{k: answer[k] for k in META[3:] if answer.get(k) is not None}}
    out: list[dict[str, Any]] = []

    def emit(index: int, **fields: Any) -> None:
        out.append({**base, "choices": [{"index": index, **fields}]})

    # Shapes a stream cannot carry are skipped here, never raised on: the rebuilt answer then differs
    # from the original, which is how `cache.storable` tells them apart.
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        logprobs = choice.get("logprobs")
        endings = {k: choice[k] for k in ENDINGS[1:] if choice.get(k) is not None}
        if endpoint == "chat":
            msg = choice.get("message")
            msg = msg if isinstance(msg, dict) else {}
            first = {"role": msg.get("role", "assistant"), "content": msg.get("content"),
                     **{k: v for k, v in msg.items() if k not in ("role", "content") and isinstance(v, str)}}
            emit(index, delta=first, logprobs=logprobs, finish_reason=None)
            calls = msg.get("tool_calls")
            for i, call in enumerate(calls if isinstance(calls, list) else []):
                if isinstance(call, dict):
                    emit(index, delta={"tool_calls": [{"index": i, **call}]}, logprobs=None, finish_reason=None)
            if msg.get("function_call"):
                emit(index, delta={"function_call": msg["function_call"]}, logprobs=None, finish_reason=None)
            emit(index, delta={}, logprobs=None, finish_reason=choice.get("finish_reason"), **endings)
        else:
            emit(index, text=choice.get("text", ""), logprobs=logprobs, finish_reason=None)
            emit(index, text="", logprobs=None, finish_reason=choice.get("finish_reason"), **endings)
    if include_usage and answer.get("usage"):
        out.append({**base, "choices": [], "usage": answer["usage"]})
    return out


def encode(chunks: list[dict[str, Any]]) -> list[bytes]:
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def _function_text(fn: Any) -> str:
    return "\n".join(v for k, v in fn.items() if k in ("name", "arguments") and isinstance(v, str)) \
        if isinstance(fn, dict) else ""


def generated_text(answer: dict[str, Any], endpoint: str = "chat") -> str:
    """Everything a whole answer generated, in every choice: message text fields (content, refusal,
    reasoning), tool and function calls, or completion text."""
    parts: list[str] = []
    for choice in answer.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if endpoint != "chat":
            parts += [choice["text"]] if isinstance(choice.get("text"), str) else []
            continue
        msg = choice.get("message")
        msg = msg if isinstance(msg, dict) else {}
        content = msg.get("content")
        if isinstance(content, list):  # content parts: their text
            parts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        parts += [v for k, v in msg.items() if k != "role" and isinstance(v, str)]
        calls = msg.get("tool_calls")
        parts += [_function_text(c.get("function")) for c in (calls if isinstance(calls, list) else [])
                  if isinstance(c, dict)]
        parts.append(_function_text(msg.get("function_call")))
    return "\n".join(p for p in parts if p)


_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')


def without_usage_chunks(events: bytes) -> bytes:
    """Whole SSE events less the usage-only chunks (`choices: []` with `usage`), for a client that did
    not ask for `stream_options.include_usage`: OpenAI sends that chunk only when asked, and code
    written against it (`chunk.choices[0]`) fails on it. The router asks upstreams for it anyway, to
    meter the stream. Events without an empty `choices` pass untouched, unparsed."""
    if not _NO_CHOICES.search(events):
        return events
    kept: list[bytes] = []
    start = 0
    for m in _EVENT_END.finditer(events):
        event = events[start:m.end()]
        start = m.end()
        if not (_NO_CHOICES.search(event) and _usage_only(event)):
            kept.append(event)
    kept.append(events[start:])
    return b"".join(kept)


def _usage_only(event: bytes) -> bool:
    data = b"\n".join(line[5:] for line in re.split(rb"\r\n|\n|\r", event) if line.startswith(b"data:"))
    try:
        chunk = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(chunk, dict) and chunk.get("choices") == [] and bool(chunk.get("usage"))
