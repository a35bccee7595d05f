"""A cached answer replays exactly what was answered, whole or as a stream, whichever way it was
cached; what cannot be replayed faithfully is not stored. The openai SDK's own stream accumulator
is the judge of what a client rebuilds from a replayed stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from oculis_router import cache
from oculis_router.sse import StreamCollector

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
CALL: dict[str, Any] = {"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
LOGPROBS = [{"token": t, "logprob": -0.5, "bytes": list(t.encode()), "top_logprobs": []} for t in ("Hi", " there")]


def chat_answer(**message: Any) -> dict[str, Any]:
    """An answer as OpenAI writes it, nulls included."""
    choice = {"index": 0, "message": {"role": "assistant", "content": None, "refusal": None, "annotations": [],
                                      **message},
              "logprobs": None, "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice],
            "usage": USAGE, "service_tier": "default", "system_fingerprint": "fp_1"}


def sse(*chunks: dict[str, Any], done: bool = True) -> list[bytes]:
    return [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + ([b"data: [DONE]\n\n"] if done else [])


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": choices}


def collected(events: list[bytes], endpoint: str = "chat") -> dict[str, Any] | None:
    c = StreamCollector(endpoint)
    for e in events:  # in odd pieces, as the network cuts them
        for i in range(0, len(e), 7):
            c.feed(e[i:i + 7])
    return c.response()


def replayed_by_sdk(answer: dict[str, Any], include_usage: bool = True) -> tuple[Any, list[Any]]:
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    chunks = [json.loads(e[6:]) for e in cache.sse_from_response(answer, "chat", include_usage)[:-1]]
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    return state.get_final_completion(), chunks


TOOL_STREAM = sse(
    chunk({"role": "assistant", "content": None,
           "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                           "function": {"name": "get_weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": ': "Paris"}'}}]}),
    chunk({}, "tool_calls"),
    {**chunk(), "usage": USAGE, "obfuscation": "xq3"},
)


def test_a_streamed_tool_call_is_cached_with_its_calls_and_replays_whole_and_streamed() -> None:
    answer = collected(TOOL_STREAM)
    assert answer is not None and cache.storable("chat", answer)
    ChatCompletion.model_validate(answer)
    choice = answer["choices"][0]
    assert choice["message"]["tool_calls"] == [CALL] and choice["message"]["content"] is None
    assert choice["finish_reason"] == "tool_calls" and answer["usage"] == USAGE
    final, _ = replayed_by_sdk(answer)
    assert final.choices[0].message.tool_calls[0].function.arguments == CALL["function"]["arguments"]
    assert final.choices[0].finish_reason == "tool_calls"


def test_a_whole_tool_call_answer_replays_as_tool_call_deltas() -> None:
    answer = chat_answer(tool_calls=[CALL])
    assert cache.storable("chat", answer)
    final, chunks = replayed_by_sdk(answer)
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * len(chunks)
    call = final.choices[0].message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "get_weather", '{"city": "Paris"}')
    assert final.choices[0].finish_reason == "tool_calls" and final.usage.total_tokens == 13
    assert chunks[0]["system_fingerprint"] == "fp_1" and chunks[0]["service_tier"] == "default"


def test_logprobs_survive_the_cache_both_ways() -> None:
    answer = chat_answer(content="Hi there")
    answer["choices"][0]["logprobs"] = {"content": LOGPROBS, "refusal": None}
    assert cache.storable("chat", answer)
    final, _ = replayed_by_sdk(answer)
    assert [t.token for t in final.choices[0].logprobs.content] == ["Hi", " there"]
    streamed = sse(chunk({"role": "assistant", "content": ""}),
                   chunk({"content": "Hi"}, logprobs={"content": LOGPROBS[:1]}),
                   chunk({"content": " there"}, logprobs={"content": LOGPROBS[1:]}),
                   chunk({}, "stop"), {**chunk(), "usage": USAGE})
    rebuilt = collected(streamed)
    assert rebuilt is not None and cache.storable("chat", rebuilt)
    assert rebuilt["choices"][0]["logprobs"] == {"content": LOGPROBS}
    assert rebuilt["choices"][0]["message"]["content"] == "Hi there"


def test_a_replayed_stream_follows_the_requests_own_usage_choice() -> None:
    answer = chat_answer(content="hi")
    _, with_usage = replayed_by_sdk(answer)
    _, without = replayed_by_sdk(answer, include_usage=False)
    assert with_usage[-1]["usage"] == USAGE and all("usage" not in c for c in without)
    # As OpenAI: only a client that asked gets the usage chunk (the router asks upstreams regardless).
    assert not cache.stream_wants_usage({}) and cache.stream_wants_usage({"stream_options": {"include_usage": True}})
    assert not cache.stream_wants_usage({"stream_options": {"include_usage": False}})
    assert not cache.stream_wants_usage({"stream_options": {}})


COMPLETION = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "usage": USAGE,
              "choices": [{"index": 0, "text": "Paris.", "finish_reason": "stop", "stop_reason": None,
                           "logprobs": {"tokens": ["Par", "is."], "token_logprobs": [-0.1, -0.2],
                                        "top_logprobs": [{"Par": -0.1}, {"is.": -0.2}], "text_offset": [0, 3]}}]}


def test_completions_are_cached_and_replayed_as_text_completion_objects_and_chunks() -> None:
    assert cache.storable("completions", COMPLETION)
    chunks = [json.loads(e[6:]) for e in cache.sse_from_response(COMPLETION, "completions")[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}  # what the SDK reads completions chunks as
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == "Paris."
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"]][-1] == "stop"
    streamed = sse(*chunks)
    rebuilt = collected(streamed, "completions")
    assert rebuilt is not None and cache.storable("completions", rebuilt)
    Completion.model_validate(rebuilt)
    assert rebuilt["choices"][0]["text"] == "Paris." and rebuilt["choices"][0]["logprobs"]["tokens"] == ["Par", "is."]


def test_a_prompt_list_keeps_one_choice_per_prompt() -> None:
    two = {**COMPLETION, "choices": [{"index": 0, "text": "Paris", "finish_reason": "stop"},
                                     {"index": 1, "text": "Madrid", "finish_reason": "length"}]}
    assert cache.storable("completions", two)
    rebuilt = collected(cache.sse_from_response(two, "completions"), "completions")
    assert rebuilt is not None
    assert [(c["text"], c["finish_reason"]) for c in rebuilt["choices"]] == [("Paris", "stop"), ("Madrid", "length")]


@pytest.mark.parametrize(("name", "answer"), [
    ("audio has no place in a replayed stream", chat_answer(content=None, audio={"id": "a1", "data": "UklGR"})),
    ("annotations are not carried by a stream", chat_answer(content="x", annotations=[{"type": "url_citation"}])),
    ("an unknown structured field", {**chat_answer(content="x"), "prompt_logprobs": [{"1": -0.1}]}),
    ("no usage", {**chat_answer(content="x"), "usage": None}),
    ("no choices", {**chat_answer(content="x"), "choices": []}),
    ("a tool_calls finish that lost its calls", {**chat_answer(content=""), "choices": [
        {"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "tool_calls"}]}),
])
def test_answers_that_cannot_be_replayed_faithfully_are_not_stored(name: str, answer: dict[str, Any]) -> None:
    assert not cache.storable("chat", answer), name


@pytest.mark.parametrize(("name", "events"), [
    ("unfinished", TOOL_STREAM[:-1]),
    ("an error event mid-stream", sse(chunk({"content": "half"}),
                                      {"error": {"message": "engine died", "type": "server_error"}},
                                      chunk({}, "stop"), {**chunk(), "usage": USAGE})),
    ("a chunk that is not JSON", [b"data: {not json\n\n", *sse(chunk({}, "stop"), {**chunk(), "usage": USAGE})]),
    ("no usage chunk (include_usage false)", sse(chunk({"content": "hi"}), chunk({}, "stop"))),
    ("an audio delta", sse(chunk({"audio": {"id": "a1", "data": "UklGR"}}), chunk({}, "stop"),
                           {**chunk(), "usage": USAGE})),
])
def test_streams_that_cannot_be_rebuilt_faithfully_are_not_stored(name: str, events: list[bytes]) -> None:
    assert collected(events) is None, name


def test_the_shapes_providers_send_are_stored() -> None:
    vllm = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "prompt_logprobs": None,
            "kv_transfer_params": None, "usage": USAGE,
            "choices": [{"index": 0, "logprobs": None, "finish_reason": "stop", "stop_reason": None,
                         "message": {"role": "assistant", "content": "hi", "reasoning_content": None,
                                     "tool_calls": []}}]}
    assert cache.storable("chat", vllm) and cache.storable("chat", chat_answer(content="hi"))
    crlf = [e.replace(b"\n", b"\r\n") for e in sse(chunk({"content": "hi"}), chunk({}, "stop"),
                                                      {**chunk(), "usage": USAGE})]
    rebuilt = collected(crlf)
    assert rebuilt is not None and rebuilt["choices"][0]["message"]["content"] == "hi"
