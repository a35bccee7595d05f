"""Anthropic's Messages API behind the OpenAI chat shape, both ways, streaming included.

What is translated: system/developer prompts (strings or text parts), user text and images
(`image_url` data URLs become base64 image blocks, http(s) URLs url image sources), assistant
`tool_calls` (-> `tool_use` blocks), `role: tool` results (-> `tool_result` blocks in a user turn),
`tools`/`tool_choice`/`parallel_tool_calls`, sampling (`temperature`, `top_p`, `top_k`, `stop`),
`max_tokens`/`max_completion_tokens` and `user`/`safety_identifier` (-> `metadata.user_id`).
Answers come back with their `tool_calls`, streamed (`input_json_delta` -> tool_call argument
deltas) or not.

What cannot be translated faithfully is refused with a 400 naming the field and why (a request
parameter Anthropic has no equivalent for, audio, files, legacy `functions`), never dropped
silently: the client would otherwise get an answer to a different question. A parameter given at
its OpenAI default (`n: 1`, `logprobs: false`, ...) changes nothing and is accepted.

Prompt caching: with `prompt_cache.enabled`, up to `breakpoints` `cache_control` markers go on the
longest stable prefixes: the end of the conversation before the newest user turn first, then the
end of the system prompt, then earlier turn boundaries. Message order is never changed.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from oculis import Upstream
from oculis_router.errors import APIError, bad_request
from oculis_router.upstream_keys import key_of

STOP = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
        "pause_turn": "stop", "refusal": "content_filter", "model_context_window_exceeded": "length"}
# Request fields with a Messages API counterpart (each is handled in translate).
TRANSLATED = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop",
              "stream", "tools", "tool_choice", "parallel_tool_calls", "user", "safety_identifier"}
# Fields that change nothing about the answer: usage is always reported on Anthropic streams, and
# prompt caching is done by the cache_control markers the router places (`prompt_cache`), not by a key.
NO_EFFECT = {"stream_options", "prompt_cache_key"}
# OpenAI defaults: a field sent with one of these values asks for nothing Anthropic does not do.
DEFAULTS: dict[str, list[Any]] = {
    "n": [1], "logprobs": [False], "top_logprobs": [0], "presence_penalty": [0], "frequency_penalty": [0],
    "logit_bias": [{}], "store": [False], "metadata": [{}], "response_format": [{"type": "text"}],
    "modalities": [["text"]], "service_tier": ["auto"],
}
# Why a field is refused, where a better hint than "no Messages API equivalent" exists.
WHY = {
    "response_format": "Anthropic has no JSON or schema mode; describe the format in the prompt, or use a tool",
    "logprobs": "Anthropic returns no log probabilities",
    "top_logprobs": "Anthropic returns no log probabilities",
    "n": "Anthropic answers one choice per request; send separate requests",
    "audio": "Anthropic answers in text only",
    "modalities": "Anthropic answers in text only",
    "functions": "legacy `functions` are not translated; send `tools`",
    "function_call": "legacy `function_call` is not translated; send `tool_choice`",
    "seed": "Anthropic has no sampling seed",
    "logit_bias": "Anthropic has no logit bias",
}
IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)(?P<params>(?:;[^;,]*)*?);base64,(?P<data>.*)", re.DOTALL)


def refused(up: Upstream, field: str, why: str) -> APIError:
    return bad_request(f"`{field}` is not supported for anthropic upstreams ({up.name}): {why}", param=field,
                       code="unsupported_parameter")


def check_params(up: Upstream, body: dict[str, Any]) -> None:
    """Refuse every request field the translation would otherwise have to drop."""
    for key in sorted(body):
        if key in TRANSLATED or key in NO_EFFECT or body[key] in DEFAULTS.get(key, []):
            continue
        raise refused(up, key, WHY.get(key, "the Messages API has no equivalent; leave it out"))


def text_of(up: Upstream, content: Any, where: str) -> list[dict[str, Any]]:
    """Text blocks of a system or tool message: a string or text parts only."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise bad_request(f"`{where}.content` must be a string or a list of text parts", param=where)
    blocks = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise refused(up, f"{where}.content[{j}]", f"this message takes text parts only, not {kind!r}")
        if part["text"]:
            blocks.append({"type": "text", "text": part["text"]})
    return blocks


def image_block(up: Upstream, part: dict[str, Any], where: str) -> dict[str, Any]:
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    if not isinstance(url, str):
        raise bad_request(f"`{where}.image_url.url` must be a string (a data: or https: URL)", param=where)
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    m = DATA_URL.fullmatch(url)
    if m is None:
        raise refused(up, f"{where}.image_url.url", "an image must be an http(s) URL or a base64 data: URL")
    if m["type"] not in IMAGE_TYPES:
        raise refused(up, f"{where}.image_url.url", f"image type {m['type']} is not one of {', '.join(IMAGE_TYPES)}")
    # `detail` is a resolution hint with no Anthropic counterpart; the image itself is sent whole.
    return {"type": "image", "source": {"type": "base64", "media_type": m["type"], "data": m["data"]}}


def user_blocks(up: Upstream, content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise bad_request(f"`{where}.content` must be a string or a list of content parts", param=where)
    blocks = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise bad_request(f"`{where}.content[{j}].text` must be a string", param=where)
            if part["text"]:
                blocks.append({"type": "text", "text": part["text"]})
        elif kind == "image_url":
            blocks.append(image_block(up, part, f"{where}.content[{j}]"))
        else:
            raise refused(up, f"{where}.content[{j}]", f"content parts of type {kind!r} are not translated "
                          "(text and image_url are)")
    return blocks


def assistant_blocks(up: Upstream, m: dict[str, Any], where: str) -> list[dict[str, Any]]:
    for key in ("function_call", "audio"):
        if m.get(key) is not None:
            raise refused(up, f"{where}.{key}", WHY[key])
    blocks = [] if m.get("content") is None else text_of(up, m["content"], where)
    calls = m.get("tool_calls") or []
    if not isinstance(calls, list):
        raise bad_request(f"`{where}.tool_calls` must be a list of calls", param=f"{where}.tool_calls")
    for k, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(call.get("id"), str):
            raise bad_request(f"`{where}.tool_calls[{k}]` needs an `id` and a `function` with a `name`",
                              param=f"{where}.tool_calls")
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = None
        if not isinstance(args, dict):
            raise bad_request(f"`{where}.tool_calls[{k}].function.arguments` must be a JSON object as a string",
                              param=f"{where}.tool_calls")
        blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": args})
    return blocks


def tool_result(up: Upstream, m: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(m.get("tool_call_id"), str):
        raise bad_request(f"`{where}.tool_call_id` is required on a tool message: the id of the call it answers",
                          param=where)
    content = m.get("content")
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": m["tool_call_id"]}
    block["content"] = content if isinstance(content, str) else text_of(up, content, where)
    return block


def translate_messages(up: Upstream, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                            list[dict[str, Any]]]:
    """(system blocks, alternating user/assistant turns) of an OpenAI conversation."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where, role = f"messages[{i}]", m.get("role")
        # Tool messages may carry the function name: redundant with tool_call_id, so nothing is lost.
        if m.get("name") is not None and role not in ("tool", "function"):
            raise refused(up, f"{where}.name", "Anthropic has no participant names; put the speaker in the content")
        if role in ("system", "developer"):
            system.extend(text_of(up, m.get("content"), where))
            continue
        if role == "user":
            turn_role, blocks = "user", user_blocks(up, m.get("content"), where)
        elif role == "assistant":
            turn_role, blocks = "assistant", assistant_blocks(up, m, where)
        elif role == "tool":
            turn_role, blocks = "user", [tool_result(up, m, where)]  # results answer in the next user turn
        elif role == "function":
            raise refused(up, f"{where}.role", "legacy function messages are not translated; use tool messages")
        else:
            raise bad_request(f"`{where}.role` {role!r} is not a chat role (system, developer, user, assistant, "
                              "tool)", param=where)
        if not blocks:
            continue  # an empty turn says nothing, and Anthropic refuses empty content
        if turns and turns[-1]["role"] == turn_role:  # Anthropic wants alternating turns
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": turn_role, "content": blocks})
    return system, turns


def translate_tools(up: Upstream, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise bad_request("`tools` must be a list of {type: function, function: {...}}", param="tools")
        out["tools"] = []
        for k, t in enumerate(tools):
            fn = t.get("function") if isinstance(t, dict) else None
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
                raise refused(up, f"tools[{k}]", "only function tools are translated")
            if not isinstance(fn.get("name"), str):
                raise bad_request(f"`tools[{k}].function.name` is required", param="tools")
            if fn.get("strict"):
                raise refused(up, f"tools[{k}].function.strict", "strict schema adherence is not translated; "
                              "leave `strict` out")
            schema = fn.get("parameters") or {}
            if not isinstance(schema, dict):
                raise bad_request(f"`tools[{k}].function.parameters` must be a JSON Schema object", param="tools")
            tool: dict[str, Any] = {"name": fn["name"], "input_schema": {"type": "object", **schema}}
            if fn.get("description"):
                tool["description"] = fn["description"]
            out["tools"].append(tool)
    choice = body.get("tool_choice")
    if choice is not None:
        if choice in ("auto", "none"):
            out["tool_choice"] = {"type": choice}
        elif choice == "required":
            out["tool_choice"] = {"type": "any"}
        elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
              and isinstance(choice["function"].get("name"), str)):
            out["tool_choice"] = {"type": "tool", "name": choice["function"]["name"]}
        else:
            raise refused(up, "tool_choice", "give auto, none, required or {type: function, function: {name}}")
    if body.get("parallel_tool_calls") is False and out.get("tools"):
        tc = out.setdefault("tool_choice", {"type": "auto"})
        if tc["type"] != "none":
            tc["disable_parallel_tool_use"] = True
    return out


def refusal(up: Upstream, endpoint: str, body: dict[str, Any]) -> APIError | None:
    """Why `up` cannot take this request (the 400 it would answer), or None: a route skips such a
    tier as it skips one without the prompt's modality."""
    try:
        translate(up, endpoint, body)
    except APIError as err:
        return err
    return None


def build_request(up: Upstream, endpoint: str, body: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, Any]]:
    out = translate(up, endpoint, body)
    headers = {"content-type": "application/json", "anthropic-version": up.anthropic_version}
    key = key_of(up)
    if key:
        headers["x-api-key"] = key
    return up.url + "/messages", headers, out


def translate(up: Upstream, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The Messages API request for an OpenAI one; a 400 (APIError) naming what cannot be translated."""
    if endpoint != "chat":
        raise bad_request(f"upstream {up.name} is an Anthropic model, which has no completions endpoint; "
                          "send the request to /v1/chat/completions", code="unsupported_endpoint")
    check_params(up, body)
    conversation = body.get("messages")
    if not isinstance(conversation, list) or not all(isinstance(m, dict) for m in conversation):
        raise bad_request("`messages` must be a list of {role, content} objects", param="messages")
    system, messages = translate_messages(up, conversation)
    if not messages:
        raise bad_request(f"upstream {up.name} (anthropic) needs at least one non-empty user or assistant message",
                          param="messages")
    out: dict[str, Any] = {"model": up.model, "messages": messages,
                           "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens")
                           or up.default_max_tokens}
    if system:
        out["system"] = system
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    stop = body.get("stop")
    if stop:
        if not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(x, str) for x in stop))):
            raise bad_request("`stop` must be a string or a list of strings", param="stop")
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    end_user = body.get("safety_identifier") or body.get("user")  # OpenAI's new name for `user`, then the old
    if isinstance(end_user, str):
        out["metadata"] = {"user_id": end_user}
    out.update(translate_tools(up, body))
    pc = up.prompt_cache
    if pc and pc.enabled and pc.breakpoints:
        place_cache_markers(out, pc.breakpoints, pc.ttl)
    return out


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


def usage_to_openai(u: Any) -> dict[str, Any]:
    u = u if isinstance(u, dict) else {}
    read, write = int(u.get("cache_read_input_tokens") or 0), int(u.get("cache_creation_input_tokens") or 0)
    prompt = int(u.get("input_tokens") or 0) + read + write
    completion = int(u.get("output_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": read}, "cache_creation_input_tokens": write}


def tool_call(block: dict[str, Any], arguments: str) -> dict[str, Any]:
    return {"id": block.get("id", ""), "type": "function",
            "function": {"name": block.get("name", ""), "arguments": arguments}}


def parse_response(endpoint: str, data: dict[str, Any]) -> dict[str, Any]:
    content = data.get("content")
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    text = "".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    calls = [tool_call(b, json.dumps(b.get("input") or {})) for b in blocks if b.get("type") == "tool_use"]
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return {"id": data.get("id", ""), "object": "chat.completion", "created": int(time.time()),
            "model": data.get("model", ""),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": STOP.get(data.get("stop_reason") or "", "stop")}],
            "usage": usage_to_openai(data.get("usage", {}))}


MAX_EVENT_BYTES = 4 * 2**20  # far above any real event (a text delta is a few tokens)


class StreamTranslator:
    """Anthropic SSE events in, OpenAI chat.completion.chunk SSE lines out."""

    def __init__(self) -> None:
        self._buf = b""
        self._id, self._model, self._usage = "", "", {}  # type: tuple[str, str, dict[str, Any]]
        self._created = int(time.time())
        self._tool_index: dict[int, int] = {}  # content block index -> OpenAI tool_calls index

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
        c: dict[str, Any] = {"id": self._id, "object": "chat.completion.chunk", "created": self._created,
                             "model": self._model,
                             "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            c["usage"] = usage
        return b"data: " + json.dumps(c).encode() + b"\n\n"

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        if len(self._buf) > MAX_EVENT_BYTES and b"\n\n" not in self._buf:
            # An event that never ends would grow this buffer without bound; the relay turns the error
            # into a `stream_interrupted` event for the client.
            raise ValueError(f"an Anthropic stream event exceeds {MAX_EVENT_BYTES} bytes without ending")
        out: list[bytes] = []
        while b"\n\n" in self._buf:
            event, self._buf = self._buf.split(b"\n\n", 1)
            payload = next((ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")), b"")
            if not payload:
                continue
            ev = json.loads(payload)
            kind = ev.get("type")
            delta = ev.get("delta") or {}
            if kind == "message_start":
                msg = ev.get("message", {})
                self._id, self._model, self._usage = msg.get("id", ""), msg.get("model", ""), msg.get("usage", {})
                out.append(self._chunk({"role": "assistant", "content": ""}))
            elif kind == "content_block_start" and (ev.get("content_block") or {}).get("type") == "tool_use":
                k = self._tool_index.setdefault(ev.get("index", 0), len(self._tool_index))
                out.append(self._chunk({"tool_calls": [{"index": k, **tool_call(ev["content_block"], "")}]}))
            elif kind == "content_block_delta" and delta.get("type") == "text_delta":
                out.append(self._chunk({"content": delta.get("text", "")}))
            elif kind == "content_block_delta" and delta.get("type") == "input_json_delta":
                k = self._tool_index.get(ev.get("index", 0), 0)
                out.append(self._chunk({"tool_calls": [{"index": k, "function": {
                    "arguments": delta.get("partial_json", "")}}]}))
            elif kind == "message_delta":
                self._usage = {**self._usage, **ev.get("usage", {})}
                out.append(self._chunk({}, STOP.get(delta.get("stop_reason") or "", "stop")))
            elif kind == "message_stop":
                out.append(self._chunk({}, usage=usage_to_openai(self._usage)))
                out.append(b"data: [DONE]\n\n")
            elif kind == "error":
                raise RuntimeError(ev.get("error", {}).get("message", "upstream stream error"))
        return out
