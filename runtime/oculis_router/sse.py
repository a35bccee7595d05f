"""Server-sent events of a chat completion stream, read on the side while they are relayed."""

from __future__ import annotations

import contextlib
import json
from typing import Any


class StreamCollector:
    """Rebuilds a chat completion from its SSE chunks (for usage and for caching streams)."""

    def __init__(self) -> None:
        self._buf = b""
        self.usage: dict[str, Any] | None = None
        self.content: list[str] = []
        self.meta: dict[str, Any] = {}
        self.finish: str | None = None
        self.complete = False

    def feed(self, data: bytes) -> None:
        self._buf += data
        while b"\n\n" in self._buf:
            event, self._buf = self._buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.complete = True
                    continue
                with contextlib.suppress(ValueError):
                    self._take(json.loads(payload))

    def _take(self, chunk: dict[str, Any]) -> None:
        self.meta = {k: chunk.get(k) for k in ("id", "created", "model")}
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.content.append(delta["content"])
            if choice.get("text"):
                self.content.append(choice["text"])
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]

    def response(self) -> dict[str, Any]:
        return {**self.meta, "object": "chat.completion",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "".join(self.content)},
                             "finish_reason": self.finish or "stop"}], "usage": self.usage}
