"""A chat or completions request body -> what the simulated engine runs, or vLLM 0.32's refusal. Pure.

The checks run in vLLM's order (request schema and its validators, the model name, the prompt's length,
max_tokens against max_model_len, then the sampling parameters) and refuse with vLLM's status, `type`,
`param` and wording (vllm/entrypoints/openai/*/protocol.py, vllm/renderers/params.py,
vllm/sampling_params.py), so a client or the router sees the same error from either engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oculis_sim.tokens import TEMPLATE_TOKENS_PER_MESSAGE, prompt_tokens

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default
MAX_N = 128  # envs.VLLM_MAX_N_SEQUENCES default


class ApiError(Exception):
    """vLLM's error body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}


def invalid(message: str, parameter: str | None = None, value: Any = None) -> ApiError:
    """A VLLMValidationError raised while serving: its str() appends the parameter and value it names."""
    extras = ([f"parameter={parameter}"] if parameter is not None else []) + \
        ([f"value={value}"] if value is not None else [])
    return ApiError(400, f"{message} ({', '.join(extras)})" if extras else message, "BadRequestError", parameter)


def schema_error(kind: str, loc: tuple[str | int, ...], msg: str, value: Any, param: str | None = None) -> ApiError:
    """FastAPI's request validation, as vLLM's handler words it (one error; type "Bad Request")."""
    err = schema_errors([(kind, loc, msg, value)])
    return err if param is None else ApiError(err.status, err.message, err.err_type, param)


def schema_errors(errors: Sequence[tuple[str, tuple[str | int, ...], str, Any]]) -> ApiError:
    """Several (kind, loc, msg, input) validation errors in one refusal; `param` is the first one's loc."""
    lines, first = [], ""
    for kind, loc, msg, value in errors:
        shown = f"<{type(value).__name__} of {len(value)} items>" if isinstance(value, (list, dict)) else value
        where = ".".join(str(p) for p in ("body", *loc))
        first = first or where
        lines.append(f"  {{'type': '{kind}', 'loc': '{where}', 'msg': '{msg}', 'input': {shown!r}}}")
    label = "error" if len(errors) == 1 else "errors"
    return ApiError(400, f"{len(errors)} validation {label}:\n" + "\n".join(lines), "Bad Request", first)


def validator_error(message: str, parameter: str) -> ApiError:
    """A request model validator's refusal: vLLM raises its VLLMValidationError through pydantic unchanged."""
    return invalid(message, parameter)


def media_type_error(content_type: str) -> ApiError | None:
    """vLLM's validate_json_request: a body that is not declared application/json is refused before parsing."""
    if content_type.split(";", 1)[0].strip().lower() == "application/json":
        return None
    return ApiError(400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                    "Bad Request")


def json_error(exc: json.JSONDecodeError) -> ApiError:
    """A body that is not JSON, as FastAPI reports it through vLLM's handler (its loc is the error's offset)."""
    return ApiError(400, f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body.{exc.pos}', 'msg': 'JSON "
                    f"decode error', 'input': '<dict of 0 items>', 'ctx': {{'error': '{exc.msg}'}}}}", "Bad Request",
                    f"body.{exc.pos}")


@dataclass(frozen=True)
class Prompt:
    """One prompt of a request (completions may send several: vLLM runs each, n times)."""

    tokens: list[str]  # its tokens (for prefix-cache block hashes)
    n: int
    text: str
    max_tokens: int | None  # the cap vLLM computes for it (None: a chat answer stops by itself, up to the limit)


@dataclass(frozen=True)
class GenRequest:
    chat: bool
    prompts: tuple[Prompt, ...]
    requested_max_tokens: int | None
    n: int
    stream: bool
    include_usage: bool
    logprobs: int | None  # top alternatives asked for (chat top_logprobs / completions logprobs); None = off
    echo: bool
    stops: tuple[str, ...]
    seed: int | None
    request_id: str | None
    priority: int = 0  # vLLM's request priority (only with --scheduling-policy priority)

    @property
    def n_prompt(self) -> int:
        """Prompt tokens of the whole request (usage counts every prompt once)."""
        return sum(p.n for p in self.prompts)


def _int(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise schema_error("int_type", (key,), "Input should be a valid integer", v)
    return v


def _float(body: dict[str, Any], key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise schema_error("float_type", (key,), "Input should be a valid number", v)
    return float(v)


def _chat_prompt(body: dict[str, Any]) -> tuple[list[str], int, str]:
    msgs = body.get("messages")
    if msgs is None:
        raise schema_error("missing", ("messages",), "Field required", body)
    if not isinstance(msgs, list):
        raise schema_error("list_type", ("messages",), "Input should be a valid list", msgs)
    parts: list[str] = []
    for i, msg in enumerate(msgs):
        if not isinstance(msg, dict) or "role" not in msg:
            raise schema_error("missing", ("messages", i, "role"), "Field required", msg)
        content = msg.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{msg.get('role', '')} {content or ''}")
    toks = prompt_tokens(parts)
    return toks, len(toks) + TEMPLATE_TOKENS_PER_MESSAGE * len(msgs), " ".join(parts)


def _completion_prompts(body: dict[str, Any]) -> list[tuple[list[str], int, str, bool]]:
    """Each prompt as (tokens, count, text, given as token ids): a string, token ids, or a list of either."""
    prompt = body.get("prompt")
    if prompt is None:
        raise schema_error("missing", ("prompt",), "Field required", body)

    def ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)

    items = [prompt] if isinstance(prompt, str) or ids(prompt) else prompt
    if not isinstance(items, list) or not items:
        raise schema_error("string_type", ("prompt",), "Input should be a valid string", prompt)
    out: list[tuple[list[str], int, str, bool]] = []
    for item in items:
        if ids(item):
            out.append(([str(x) for x in item], len(item), "", True))
        elif isinstance(item, str):
            toks = prompt_tokens([item])
            out.append((toks, max(1, len(toks)), item, False))
        else:
            raise schema_error("string_type", ("prompt",), "Input should be a valid string", prompt)
    return out


def parse(body: Any, chat: bool, served: tuple[str, ...], max_model_len: int,
          request_id: str | None = None, priority_scheduling: bool = False) -> GenRequest:
    """The request as the engine runs it, or ApiError in the order vLLM checks."""
    if not isinstance(body, dict):
        raise schema_error("model_attributes_type", (), "Input should be a valid dictionary or object to extract "
                           "fields from", body)
    # the request model: field types, then its validators
    prompts = [(*_chat_prompt(body), False)] if chat else _completion_prompts(body)
    max_completion = _int(body, "max_completion_tokens") if chat else None
    max_tokens = _int(body, "max_tokens")
    n = _int(body, "n")
    temperature = _float(body, "temperature")
    top_p = _float(body, "top_p")
    seed = _int(body, "seed")
    stream = bool(body.get("stream"))
    opts = body.get("stream_options")
    if opts is not None and not stream:
        raise validator_error("Stream options can only be defined when `stream=True`.", "stream_options")
    if chat:
        top = _int(body, "top_logprobs")
        want = bool(body.get("logprobs"))
        if top is not None:
            if top < 0 and top != -1:
                raise validator_error("`top_logprobs` must be a positive value or -1.", "top_logprobs")
            if (top == -1 or top > 0) and not want:
                raise validator_error("when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs")
        logprobs = (top or 0) if want else None
    else:
        logprobs = _int(body, "logprobs")
    # the model
    model = body.get("model")
    if model and model not in served:
        raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(served)}.",
                       "NotFoundError", "model")
    # max_tokens against the context (TokenizeParams), then the prompt's length
    out_param = "max_completion_tokens" if max_completion is not None else "max_tokens"
    requested = max_completion if max_completion is not None else max_tokens
    if requested is None and not chat:
        requested = COMPLETIONS_DEFAULT_MAX_TOKENS
    if requested is not None and requested > max_model_len:
        raise invalid(f"{out_param}={requested} cannot be greater than max_model_len={max_model_len}. "
                      "Please request fewer output tokens.", out_param, requested)
    for _, n_prompt, _, as_ids in prompts:
        if n_prompt > max_model_len:
            # the tokenizer stops at max_model_len + 1 tokens, so vLLM says "at least" for text prompts
            count, qualifier = (n_prompt, "") if as_ids else (max_model_len + 1, "at least ")
            raise invalid(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                          f"contains {qualifier}{count} input tokens, which exceeds this limit even without any "
                          "output tokens. Please reduce the length of the input prompt.", "input_tokens", count)
    # the sampling parameters (SamplingParams._verify_args)
    n = 1 if n is None else n
    if n < 1:
        raise invalid(f"n must be at least 1, got {n}.")
    if n > MAX_N:
        raise invalid(f"n must be at most {MAX_N}, got {n}. To increase this limit, set the VLLM_MAX_N_SEQUENCES "
                      "environment variable.")
    if temperature is not None:
        if not math.isfinite(temperature):
            raise invalid(f"temperature must be a finite number, got {temperature}.", "temperature", temperature)
        if temperature < 0:
            raise invalid(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)
        if temperature > 2:
            raise invalid(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
    if top_p is not None and not 0 < top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {top_p}.", "top_p", top_p)
    if requested is not None and requested < 1:
        raise invalid(f"max_tokens must be at least 1, got {requested}.", "max_tokens", requested)
    if logprobs is not None and logprobs != -1 and logprobs < 0:
        raise invalid(f"logprobs must be non-negative or -1, got {logprobs}.", "logprobs", logprobs)
    if temperature is not None and temperature < 1e-5 and n > 1:
        raise invalid(f"n must be 1 when using greedy sampling, got {n}.")
    # vLLM 0.32 takes a priority under either policy (fcfs ignores it: tests/realengine/test_priority_real.py)
    priority = (_int(body, "priority") or 0) if priority_scheduling else 0
    stop = body.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(s for s in stop or [] if isinstance(s, str))
    if any(not s for s in stops):
        raise invalid("stop cannot contain an empty string.")
    return GenRequest(
        chat=chat, prompts=tuple(Prompt(toks, count, text, None if requested is None else
                                        min(requested, max_model_len - count)) for toks, count, text, _ in prompts),
        requested_max_tokens=requested, n=n, stream=stream,
        include_usage=bool(opts.get("include_usage")) if isinstance(opts, dict) else False,
        logprobs=None if logprobs is None else (20 if logprobs == -1 else logprobs),
        echo=bool(body.get("echo")) and not chat, stops=stops, seed=seed, request_id=request_id, priority=priority)
