"""What a relayed stream must be before a client sees it: whole SSE events, each `data:` a JSON
object or `[DONE]`, ending with `[DONE]`.

An OpenAI SDK reading a stream fails on a `data:` line that does not parse, with a parse error and
no word of what happened, and takes a stream that simply stops for a complete answer. So the relay
passes events through this gate: a good event goes on as soon as its blank line arrives (nothing
waits longer than the event it belongs to), a malformed one is held back and `MalformedStream` is
raised, and a stream that ends before `[DONE]` raises too; the relay then ends the client's stream
with an error event (`stream_interrupted`) and counts it `stream_broken`. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

from oculis_router import strictjson

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")  # SSE allows CRLF, LF and CR line ends
_LINE_END = re.compile(rb"\r\n|\n|\r")
MAX_EVENT_BYTES = 8 * 1024 * 1024  # one event; an upstream that never ends one must not fill memory


class MalformedStream(ValueError):
    """The upstream's stream broke the SSE/OpenAI contract; the message says how (our words, never
    the upstream's text)."""


class EventGate:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._buf = b""
        self._scanned = 0  # bytes of _buf already searched for an event end
        self.done = False  # `data: [DONE]` went through
        self.failure: MalformedStream | None = None  # the first bad event; the stream ends there
        self.errored = False  # an event carried an `error` object: relayed (it explains itself), but a failure

    def feed(self, data: bytes) -> bytes:
        """The complete, checked events among what has arrived so far (possibly none). After a bad
        event `failure` is set: the good events before it are still returned, nothing after it."""
        if self.failure:
            return b""
        self._buf += data
        out: list[bytes] = []
        start = 0
        try:
            while (m := _EVENT_END.search(self._buf, max(start, self._scanned - 3))) is not None:
                self._check(self._buf[start:m.start()])
                out.append(self._buf[start:m.end()])
                start = m.end()
            if len(self._buf) - start > MAX_EVENT_BYTES:
                raise MalformedStream(f"upstream {self.upstream} sent an event over {MAX_EVENT_BYTES} bytes")
        except MalformedStream as exc:
            self.failure = exc
            self._buf = b""
            return b"".join(out)
        self._buf = self._buf[start:]
        self._scanned = len(self._buf)
        return b"".join(out)

    def close(self) -> bytes:
        """At the end of the upstream's stream: a last event without its blank line still counts; a
        stream without `[DONE]` is cut."""
        rest, self._buf = self._buf, b""
        if self.failure:
            raise self.failure
        if rest.strip():
            self._check(rest.rstrip(b"\r\n"))
            rest = rest.rstrip(b"\r\n") + b"\n\n"
        if not self.done and not self.errored:  # an error event already told the client why it ends
            raise MalformedStream(f"upstream {self.upstream} ended the stream before data: [DONE]")
        return rest

    def _check(self, event: bytes) -> None:
        data = [line[5:].removeprefix(b" ") for line in _LINE_END.split(event) if line.startswith(b"data:")]
        if not data:
            return  # a comment (keep-alive) or an `event:`/`id:`/`retry:` line alone
        payload = b"\n".join(data)  # several data lines are one value, joined as SSE readers do
        if payload.strip() == b"[DONE]":
            self.done = True
            return
        try:
            value: Any = strictjson.loads(payload, "an event")
        except ValueError as exc:
            raise MalformedStream(f"upstream {self.upstream} sent a malformed event: {exc}") from None
        if not isinstance(value, dict):
            raise MalformedStream(f"upstream {self.upstream} sent an event that is a JSON {type(value).__name__}, "
                                  "not an object")
        if value.get("error") is not None:
            self.errored = True
