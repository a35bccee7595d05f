"""Anthropic's Messages API behind the OpenAI chat shape, both ways, streaming included.

Prompt caching: with `prompt_cache.enabled`, up to `breakpoints` `cache_control` markers go on the
longest stable prefixes: the end of the conversation before the newest user turn first, then the
end of the system prompt, then earlier turn boundaries. Message order is never changed.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from oculis import Upstream
from oculis_router.errors import bad_request

STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls"}


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [{"type": "text", "text": p.get("text", "")} for p in content if isinstance(p, dict)
                and p.get("type") == "text"]
    return []


def build_request(up: Upstream, endpoint: str, body: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, Any]]:
    if endpoint != "chat":
        raise bad_request(f"upstream {up.name} is an Anthropic model, which has no completions endpoint; "
                          "send the request to /v1/chat/completions", code="unsupported_endpoint")
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    for m in body.get("messages", []):
        role = m.get("role")
        if role in ("system", "developer"):
            system.extend(_blocks(m.get("content")))
        elif role in ("user", "assistant"):
            blocks = _blocks(m.get("content"))
            if messages and messages[-1]["role"] == role:  # Anthropic wants alternating turns
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": role, "content": blocks})
    out: dict[str, Any] = {"model": up.model, "messages": messages,
                           "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens")
                           or up.default_max_tokens}
    if system:
        out["system"] = system
    for ours, theirs in (("temperature", "temperature"), ("top_p", "top_p"), ("stream", "stream")):
        if body.get(ours) is not None:
            out[theirs] = body[ours]
    stop = body.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    pc = up.prompt_cache
    if pc and pc.enabled and pc.breakpoints:
        place_cache_markers(out, pc.breakpoints, pc.ttl)
    headers = {"content-type": "application/json", "anthropic-version": up.anthropic_version}
    key = os.environ.get(up.api_key_env) if up.api_key_env else None
    if key:
        headers["x-api-key"] = key
    return up.url + "/messages", headers, out


def place_cache_markers(req: dict[str, Any], breakpoints: int, ttl: str) -> None:
    """Mark the ends of the longest stable prefixes, longest first, at most `breakpoints` of them."""
    marker: dict[str, Any] = {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}
    msgs = req["messages"]
    last_user = max((i for i, m in enumerate(msgs) if m["role"] == "user"), default=-1)
    candidates: list[dict[str, Any]] = [msgs[i]["content"][-1] for i in range(last_user - 1, -1, -1)
                                        if msgs[i]["content"]]
    if req.get("system"):
        candidates.insert(1 if candidates else 0, req["system"][-1])
    for block in candidates[:breakpoints]:
        block["cache_control"] = dict(marker)


def usage_to_openai(u: dict[str, Any]) -> dict[str, Any]:
    read, write = int(u.get("cache_read_input_tokens") or 0), int(u.get("cache_creation_input_tokens") or 0)
    prompt = int(u.get("input_tokens") or 0) + read + write
    completion = int(u.get("output_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}, "cache_creation_input_tokens": write}


def parse_response(endpoint: str, data: dict[str, Any]) -> dict[str, Any]:
    text = "".join(b.get("text", "") for b in data.get("content", []) if b.get("type") == "text")
    return {"id": data.get("id", ""), "object": "chat.completion", "created": int(time.time()),
            "model": data.get("model", ""),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": STOP.get(data.get("stop_reason") or "", "stop")}],
            "usage": usage_to_openai(data.get("usage", {}))}


class StreamTranslator:
    """Anthropic SSE events in, OpenAI chat.completion.chunk SSE lines out."""

    def __init__(self) -> None:
        self._buf = b""
        self._id, self._model, self._usage = "", "", {}  # type: tuple[str, str, dict[str, Any]]
        self._created = int(time.time())

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
        c: dict[str, Any] = {"id": self._id, "object": "chat.completion.chunk", "created": self._created,
                             "model": self._model,
                             "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            c["usage"] = usage
        return b"data: " + json.dumps(c).encode() + b"\n\n"

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while b"\n\n" in self._buf:
            event, self._buf = self._buf.split(b"\n\n", 1)
            payload = next((ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")), b"")
            if not payload:
                continue
            ev = json.loads(payload)
            kind = ev.get("type")
            if kind == "message_start":
                msg = ev.get("message", {})
                self._id, self._model, self._usage = msg.get("id", ""), msg.get("model", ""), msg.get("usage", {})
                out.append(self._chunk({"role": "assistant", "content": ""}))
            elif kind == "content_block_delta" and ev.get("delta", {}).get("type") == "text_delta":
                out.append(self._chunk({"content": ev["delta"].get("text", "")}))
            elif kind == "message_delta":
                self._usage = {**self._usage, **ev.get("usage", {})}
                out.append(self._chunk({}, STOP.get(ev.get("delta", {}).get("stop_reason") or "", "stop")))
            elif kind == "message_stop":
                out.append(self._chunk({}, usage=usage_to_openai(self._usage)))
                out.append(b"data: [DONE]\n\n")
            elif kind == "error":
                raise RuntimeError(ev.get("error", {}).get("message", "upstream stream error"))
        return out
