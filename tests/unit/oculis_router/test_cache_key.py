"""The response cache key: one request body varied by each field. A field that changes the answer
must never let two requests share an entry; a field on the answer-neutral list must."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from oculis import ResponseCache, Upstream
from oculis.base import format_errors
from oculis.router import RouteBody
from oculis_router import cache

UP = Upstream(name="u", provider="vllm", base_url="http://127.0.0.1:1/v1", model="m")
CFG = ResponseCache(enabled=True)
# The allow-list the example config and the QA pass used: it must not narrow the key any more.
OLD_CFG = ResponseCache(enabled=True, key=["model", "messages", "temperature"])
CHAT = {"model": "r", "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]}
COMPLETION = {"model": "r", "temperature": 0, "prompt": "Capital of France?"}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}

CHAT_ANSWER_CHANGING: dict[str, Any] = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "r"}],
    "system prompt": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "q"}],
    "model": "other-route",
    "temperature": 0.001,
    "response_format": {"type": "json_object"},
    "tools": [TOOL],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "max_tokens": 5,
    "max_completion_tokens": 5,
    "stop": ["\n"],
    "seed": 7,
    "top_p": 0.5,
    "logprobs": True,
    "top_logprobs": 3,
    "n": 2,
    "presence_penalty": 1.0,
    "frequency_penalty": 1.0,
    "logit_bias": {"50256": -100},
    "reasoning_effort": "high",
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "service_tier": "flex",
    # Fields the router does not know (vLLM's extensions) are in the key too, not silently shared.
    "top_k": 1,
    "guided_json": {"type": "object"},
    "repetition_penalty": 1.2,
}
COMPLETION_ANSWER_CHANGING: dict[str, Any] = {
    "prompt": "Write a poem about the sea",
    "prompt list": ["Capital of France?", "Capital of Spain?"],
    "suffix": " is the answer.",
    "echo": True,
    "logit_bias": {"50256": -100},
    "best_of": 3,
    "logprobs": 2,
    "max_tokens": 5,
    "stop": ".",
    "seed": 7,
}
ANSWER_NEUTRAL: dict[str, Any] = {
    "stream": True,
    "stream_options": {"include_usage": False},
    "user": "end-user-42",
    "safety_identifier": "hash-of-user",
    "metadata": {"team": "search"},
    "store": True,
    "prompt_cache_key": "tenant-shard-3",
    "seed": None,  # null is unset, as the OpenAI API reads it
}


def key(body: dict[str, Any], cfg: ResponseCache = CFG, endpoint: str = "chat") -> str:
    return cache.cache_key(cfg, body, "tenant", UP, endpoint)


def varied(base: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
    field = {"system prompt": "messages", "prompt list": "prompt"}.get(name, name)
    return {**base, field: value}


@pytest.mark.parametrize("cfg", [CFG, OLD_CFG], ids=["default", "old-allow-list"])
@pytest.mark.parametrize(("name", "value"), CHAT_ANSWER_CHANGING.items(), ids=list(CHAT_ANSWER_CHANGING))
def test_cache_key_covers_every_answer_changing_chat_field(cfg: ResponseCache, name: str, value: Any) -> None:
    assert key(varied(CHAT, name, value), cfg) != key(CHAT, cfg)


@pytest.mark.parametrize("cfg", [CFG, OLD_CFG], ids=["default", "old-allow-list"])
@pytest.mark.parametrize(("name", "value"), COMPLETION_ANSWER_CHANGING.items(), ids=list(COMPLETION_ANSWER_CHANGING))
def test_cache_key_covers_every_answer_changing_completions_field(cfg: ResponseCache, name: str, value: Any) -> None:
    body = varied(COMPLETION, name, value)
    assert key(body, cfg, "completions") != key(COMPLETION, cfg, "completions")


@pytest.mark.parametrize(("name", "value"), ANSWER_NEUTRAL.items(), ids=list(ANSWER_NEUTRAL))
def test_cache_key_leaves_out_only_fields_that_never_change_the_answer(name: str, value: Any) -> None:
    assert key({**CHAT, name: value}) == key(CHAT)
    assert key({**COMPLETION, name: value}, endpoint="completions") == key(COMPLETION, endpoint="completions")


def test_cache_key_ignores_field_order_and_separates_endpoints() -> None:
    assert key(dict(reversed(CHAT.items()))) == key(CHAT)
    same_text = {"model": "r", "temperature": 0, "prompt": "q", "messages": [{"role": "user", "content": "q"}]}
    assert key(same_text, endpoint="chat") != key(same_text, endpoint="completions")


def test_cache_key_covers_the_upstream_config_that_shapes_the_answer() -> None:
    for change in ({"model": "m2"}, {"revision": "2"}, {"default_max_tokens": 16}, {"name": "v"}):
        assert cache.cache_key(CFG, CHAT, "t", UP.model_copy(update=change), "chat") != key(CHAT), change


def test_cache_ignore_leaves_out_what_the_operator_names_but_never_the_question() -> None:
    cfg = ResponseCache(enabled=True, ignore=["seed"])
    assert key({**CHAT, "seed": 1}, cfg) == key({**CHAT, "seed": 2}, cfg)
    assert key(CHAT, cfg) != key(CHAT)  # replicas with another `ignore` (mid-rollout) never share entries
    assert key({**CHAT, "top_p": 0.5}, cfg) != key(CHAT, cfg)
    for question in ("messages", "prompt", "suffix", "model"):
        with pytest.raises(ValidationError) as err:
            RouteBody.model_validate({"tiers": [{"name": "a", "upstream": "u"}], "cache": {"ignore": [question]}})
        line = format_errors(err.value, "routes.0")
        assert line == (f"routes.0.cache.ignore: {question!r} carries the question itself and is always part of the "
                        "cache key; remove it from the list")


def test_the_documented_neutral_fields_are_the_ones_left_out() -> None:
    described = ResponseCache.model_fields["ignore"].description or ""
    listed = described.split("(", 1)[1].split(" always are")[0].replace(" and ", ", ")
    assert {f.strip() for f in listed.split(",")} == set(cache.ANSWER_NEUTRAL)
