"""vLLM 0.32's OpenAI response bodies and stream chunks, built from plain values. Pure.

Field sets and their order follow vLLM's pydantic models as it serializes them (chat: ChatCompletionResponse,
ChatCompletionStreamResponse; completions: CompletionResponse, CompletionStreamResponse). The honesty
marker: `system_fingerprint` is "oculis-simulator" where vLLM sends the key (vLLM's value is null).
"""

from __future__ import annotations

import json
from typing import Any

from oculis_sim import FINGERPRINT


def usage(prompt: int, completion: int, cached: int | None = None, created: int = 0, streamed: bool = False,
          chat: bool = True) -> dict[str, Any]:
    """UsageInfo. prompt_tokens_details only with --enable-prompt-tokens-details (cached is then not None):
    chat also reports the prompt tokens this request wrote to the prefix cache, completions does not; a
    stream's usage chunk leaves unset fields out, bodies say null."""
    use: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                           "completion_tokens": completion}
    details: dict[str, Any] | None = None
    if cached is not None:
        details = {"cached_tokens": cached, "created_cache_tokens": created if chat else None,
                   "multimodal_tokens": None}
    if not streamed:
        use.update(prompt_tokens_details=details, completion_tokens_details=None)
    elif details is not None:
        use["prompt_tokens_details"] = {k: v for k, v in details.items() if v is not None}
    return use


def chat_choice(index: int, text: str, finish: str, logprobs: Any) -> dict[str, Any]:
    return {"index": index, "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None,
                                        "audio": None, "function_call": None, "reasoning": None},
            "logprobs": logprobs, "finish_reason": finish, "stop_reason": None, "token_ids": None,
            "routed_experts": None}


def completion_choice(index: int, text: str, finish: str, logprobs: Any) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": None,
            "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}


def body(chat: bool, rid: str, created: int, model: str, choices: list[dict[str, Any]],
         use: dict[str, Any]) -> dict[str, Any]:
    if chat:
        return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
                "service_tier": None, "system_fingerprint": FINGERPRINT, "usage": use, "prompt_logprobs": None,
                "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
                "ec_transfer_params": None, "metrics": None}
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "service_tier": None, "system_fingerprint": FINGERPRINT, "usage": use, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None}


def event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chunk(chat: bool, rid: str, created: int, model: str, index: int, text: str | None, finish: str | None = None,
          logprobs: Any = None, role: bool = False, last: bool = False) -> dict[str, Any]:
    """One streamed choice delta, with the fields vLLM 0.32 sets on it. Chat's first chunk per choice carries
    the role and empty content; `last`: a terminal chunk of a stream without a usage chunk, which vLLM
    stamps with system_fingerprint."""
    out: dict[str, Any]
    if chat:
        if role:
            return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}], "prompt_token_ids": None, "prompt_text": None}
        choice: dict[str, Any] = {"index": index, "delta": {"content": text}, "logprobs": logprobs,
                                  "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        out = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
    else:
        out = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [
            {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish, "stop_reason": None,
             "prompt_token_ids": None, "token_ids": None}]}
    if last and finish is not None:
        out["system_fingerprint"] = FINGERPRINT
    return out


def usage_chunk(chat: bool, rid: str, created: int, model: str, use: dict[str, Any]) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model, "choices": [], "usage": use, "system_fingerprint": FINGERPRINT}


def fast_parts(chat: bool, rid: str, created: int, model: str, index: int) -> tuple[bytes, bytes]:
    """The bytes around a plain content chunk's text (placeholder words need no JSON escaping), so the hot
    path (hundreds of streams x every step) only concatenates."""
    head, _, tail = event(chunk(chat, rid, created, model, index, "\x00")).partition(b"\\u0000")
    return head, tail
