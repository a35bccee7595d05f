"""A sweep over request bodies and upstream answers of any shape (hypothesis): the cache key splits
on every answer-changing field, the stream rebuild and the storability check never raise on what an
upstream sends, and whatever is stored replays to the same answer, whole or streamed."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from oculis import ResponseCache, Upstream
from oculis_router import cache
from oculis_router.sse import StreamCollector

UP = Upstream(name="u", provider="vllm", base_url="http://127.0.0.1:1/v1", model="m")
CFG = ResponseCache(enabled=True)

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
json_values: st.SearchStrategy[Any] = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=12)
fields = st.sampled_from(["model", "messages", "prompt", "temperature", "top_p", "seed", "stop", "tools",
                          "tool_choice", "response_format", "logprobs", "max_tokens", "suffix", "echo", "n",
                          "top_k", "guided_json", *cache.ANSWER_NEUTRAL]) | st.text(min_size=1, max_size=12)
bodies = st.dictionaries(fields, json_values, max_size=6)


def canonical(body: dict[str, Any]) -> str:
    """The request as JSON says it (1 and true, 0 and 0.0 differ there), nulls left out."""
    return json.dumps({k: v for k, v in body.items() if v is not None}, sort_keys=True)


def key(body: dict[str, Any], endpoint: str = "chat") -> str:
    return cache.cache_key(CFG, body, "t", UP, endpoint)


@settings(max_examples=300, deadline=None)
@given(body=bodies, field=fields, value=json_values)
def test_changing_any_field_but_the_neutral_ones_changes_the_key(body: dict[str, Any], field: str,
                                                                  value: Any) -> None:
    changed = {**body, field: value}
    # `null` is unset: setting a field to null is the same request as leaving it out.
    same_request = field in cache.ANSWER_NEUTRAL or canonical(changed) == canonical(body)
    assert (key(changed) == key(body)) == same_request


Strategy = st.SearchStrategy[Any]
text = st.text(max_size=20)
calls: Strategy = st.fixed_dictionaries({"id": text, "type": st.just("function"),
                                         "function": st.fixed_dictionaries({"name": text, "arguments": text})})
token_logprobs: Strategy = st.fixed_dictionaries({"token": text, "logprob": st.floats(-20, 0),
                                                  "top_logprobs": st.just([])})
usage: Strategy = st.fixed_dictionaries({"prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99)})
# Mostly the shapes providers send, sometimes with a field a stream cannot carry, sometimes junk.
plain_messages: Strategy = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.none() | text},
    optional={"tool_calls": st.lists(calls, max_size=2), "refusal": st.none() | text, "reasoning_content": text})
odd_messages: Strategy = st.fixed_dictionaries(
    {"role": st.just("assistant"), "content": st.none() | text},
    optional={"audio": json_values, "annotations": st.lists(json_values, max_size=1), "tool_calls": json_values})
chat_choices: Strategy = st.fixed_dictionaries(
    {"index": st.integers(0, 2), "message": plain_messages | odd_messages | json_values,
     "finish_reason": st.sampled_from(["stop", "length", "tool_calls", None])},
    optional={"logprobs": st.none() | st.fixed_dictionaries({"content": st.lists(token_logprobs, max_size=2)}),
              "stop_reason": st.none() | text | st.integers()})
chat_answers: Strategy = st.fixed_dictionaries(
    {"id": text, "object": st.just("chat.completion"), "created": st.integers(0, 2**31), "model": text,
     "choices": st.lists(chat_choices, min_size=1, max_size=2, unique_by=lambda c: str(c["index"])),
     "usage": usage | json_values},
    optional={"system_fingerprint": text, "service_tier": text, "extra": json_values})
text_choices: Strategy = st.fixed_dictionaries(
    {"index": st.integers(0, 2), "text": text | json_values, "finish_reason": st.sampled_from(["stop", "length"])},
    optional={"logprobs": st.none() | st.fixed_dictionaries({"tokens": st.lists(text, max_size=2)})})
text_answers: Strategy = st.fixed_dictionaries(
    {"id": text, "object": st.just("text_completion"), "created": st.integers(0, 9), "model": text,
     "choices": st.lists(text_choices, min_size=1, max_size=2, unique_by=lambda c: str(c["index"])),
     "usage": usage})


def rebuilt(events: list[bytes], endpoint: str) -> dict[str, Any] | None:
    c = StreamCollector(endpoint)
    for e in events:
        c.feed(e)
    return c.response()


@settings(max_examples=400, deadline=None)
@given(answer=chat_answers | json_values)
def test_whatever_a_chat_upstream_answers_is_stored_only_if_it_replays_the_same(answer: Any) -> None:
    if not cache.storable("chat", answer):
        return
    again = rebuilt(cache.sse_from_response(answer, "chat"), "chat")
    assert again is not None
    assert cache._pruned(again) == cache._pruned(answer)


@settings(max_examples=200, deadline=None)
@given(answer=text_answers)
def test_whatever_a_completions_upstream_answers_is_stored_only_if_it_replays_the_same(answer: Any) -> None:
    if not cache.storable("completions", answer):
        return
    chunks = [json.loads(e[6:]) for e in cache.sse_from_response(answer, "completions")[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    again = rebuilt(cache.sse_from_response(answer, "completions"), "completions")
    assert again is not None and cache._pruned(again) == cache._pruned(answer)


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(json_values | chat_answers.map(lambda a: {**a, "object": "chat.completion.chunk"}),
                       max_size=5),
       cuts=st.lists(st.integers(1, 40), max_size=8), done=st.booleans(),
       endpoint=st.sampled_from(["chat", "completions"]))
def test_the_stream_rebuild_never_raises_on_any_upstream_stream(chunks: list[Any], cuts: list[int], done: bool,
                                                                 endpoint: str) -> None:
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    raw += b"data: [DONE]\n\n" if done else b""
    c = StreamCollector(endpoint)
    at = 0
    for n in [*cuts, len(raw)]:
        c.feed(raw[at:at + n])
        at += n
    c.feed(raw[at:])
    answer = c.response()
    assert answer is None or isinstance(answer, dict)


def test_plain_answers_are_stored_so_the_sweep_is_not_vacuous() -> None:
    plain = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "usage": {"prompt_tokens": 1},
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
    assert cache.storable("chat", plain)
