"""The Anthropic translation carries every field it can (both ways, streamed and not) and refuses by
name what it cannot; nothing is dropped silently."""

from __future__ import annotations

import json
from typing import Any

import pytest

from oculis import Upstream
from oculis_router.errors import APIError
from oculis_router.providers import anthropic, refusal

UP = Upstream(name="claude", provider="anthropic", model="claude-x")
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "description": "does f",
                                         "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}


def sent(**body: Any) -> dict[str, Any]:
    return anthropic.build_request(UP, "chat", {"model": "r", "messages": USER, **body})[2]


@pytest.mark.parametrize(
    ("openai", "expected"),
    [
        ({"stop": "END"}, {"stop_sequences": ["END"]}),
        ({"stop": ["a", "b"]}, {"stop_sequences": ["a", "b"]}),
        ({"top_p": 0.9}, {"top_p": 0.9}),
        ({"top_k": 40}, {"top_k": 40}),
        ({"temperature": 0.2}, {"temperature": 0.2}),
        ({"max_completion_tokens": 77}, {"max_tokens": 77}),
        ({"max_tokens": 5, "max_completion_tokens": 77}, {"max_tokens": 5}),
        ({"user": "u-42"}, {"metadata": {"user_id": "u-42"}}),
        ({"safety_identifier": "s-1", "user": "u-42"}, {"metadata": {"user_id": "s-1"}}),
        ({"stream": True}, {"stream": True}),
        ({"tools": [TOOL]}, {"tools": [{"name": "f", "description": "does f",
                                        "input_schema": TOOL["function"]["parameters"]}]}),  # type: ignore[index]
        ({"tools": [{"type": "function", "function": {"name": "g", "parameters": {}}}]},
         {"tools": [{"name": "g", "input_schema": {"type": "object"}}]}),  # Anthropic needs an object schema
        ({"tools": [TOOL], "tool_choice": "auto"}, {"tool_choice": {"type": "auto"}}),
        ({"tools": [TOOL], "tool_choice": "none"}, {"tool_choice": {"type": "none"}}),
        ({"tools": [TOOL], "tool_choice": "required"}, {"tool_choice": {"type": "any"}}),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}},
         {"tool_choice": {"type": "tool", "name": "f"}}),
        ({"tools": [TOOL], "parallel_tool_calls": False},
         {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}),
    ],
)
def test_every_request_field_with_a_counterpart_is_carried(openai: dict[str, Any], expected: dict[str, Any]) -> None:
    out = sent(**openai)
    assert {k: out[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"n": 3}, "n"),
        ({"seed": 1}, "seed"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"audio": {"voice": "alloy"}}, "audio"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"functions": [TOOL["function"]]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"verbosity": "low"}, "verbosity"),
        ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ({"guided_json": {}}, "guided_json"),  # a vLLM extension: no Messages API counterpart
        ({"tools": [{"type": "custom", "custom": {"name": "c"}}]}, "tools[0]"),
        ({"tools": [{**TOOL, "function": {**TOOL["function"], "strict": True}}]},  # type: ignore[dict-item]
         "tools[0].function.strict"),
        ({"tools": [TOOL], "tool_choice": {"type": "allowed_tools", "allowed_tools": {}}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "file", "file": {"file_id": "f"}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                     "image_url": {"url": "data:image/bmp;base64,AA"}}]}]},
         "messages[0].content[0].image_url.url"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]},
         "messages[0].content[0].image_url.url"),
        ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "https://x"}}]},
                       *USER]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"messages": [*USER, {"role": "assistant", "content": None, "function_call": {"name": "f"}}]},
         "messages[1].function_call"),
        ({"messages": [*USER, {"role": "function", "name": "f", "content": "1"}]}, "messages[1].role"),
    ],
)
def test_what_cannot_be_translated_is_refused_by_name(body: dict[str, Any], field: str) -> None:
    with pytest.raises(APIError) as err:
        anthropic.build_request(UP, "chat", {"model": "r", "messages": USER, **body})
    e = err.value
    assert e.status == 400 and e.param == field and f"`{field}`" in e.message and "anthropic" in e.message
    assert refusal(UP, "chat", {"model": "r", "messages": USER, **body}) is not None  # what routes skip on


@pytest.mark.parametrize("body", [{"n": 1}, {"logprobs": False}, {"presence_penalty": 0}, {"frequency_penalty": 0.0},
                                  {"logit_bias": {}}, {"response_format": {"type": "text"}}, {"store": False},
                                  {"stream_options": {"include_usage": True}}, {"modalities": ["text"]},
                                  {"prompt_cache_key": "k"}])
def test_openai_defaults_ask_nothing_and_are_accepted(body: dict[str, Any]) -> None:
    assert refusal(UP, "chat", {"model": "r", "messages": USER, **body}) is None


def test_openai_compatible_upstreams_refuse_nothing() -> None:
    vllm = Upstream(name="v", provider="vllm", base_url="http://127.0.0.1:1/v1")
    assert refusal(vllm, "completions", {"prompt": "x", "guided_json": {}, "top_k": 1, "whatever": [1]}) is None
    assert refusal(UP, "completions", {"prompt": "x"}) is not None  # Anthropic has no completions endpoint


def test_a_tool_conversation_and_images_become_anthropic_blocks() -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "rules"}]},
        {"role": "system", "content": "more rules"},
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     {"type": "image_url",
                                      "image_url": {"url": "data:image/jpeg;base64,/9j/", "detail": "low"}},
                                     {"type": "image_url", "image_url": {"url": "https://e.com/a.webp"}}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "name": "f", "content": [{"type": "text", "text": "two"}]},
        {"role": "user", "content": "and?"},
        {"role": "assistant", "content": ""},  # empty: nothing to say, and Anthropic refuses empty text
    ]
    out = anthropic.build_request(UP, "chat", {"model": "r", "messages": messages})[2]
    assert out["system"] == [{"type": "text", "text": "rules"}, {"type": "text", "text": "more rules"}]
    assert out["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
            {"type": "image", "source": {"type": "url", "url": "https://e.com/a.webp"}}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}},
            {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]},
        # the results open the next user turn, before its text, as Anthropic requires
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
            {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "two"}]},
            {"type": "text", "text": "and?"}]},
    ]


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{not json"}}]},
         "messages[1].tool_calls"),
        ({"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}, "messages[1].tool_calls"),
        ({"role": "tool", "content": "x"}, "messages[1]"),
        ({"role": "critic", "content": "x"}, "messages[1]"),
    ],
)
def test_malformed_conversations_are_a_400_naming_the_message(message: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as err:
        anthropic.build_request(UP, "chat", {"messages": [*USER, message]})
    assert err.value.status == 400 and err.value.param == param


def test_a_system_only_conversation_is_a_clear_400() -> None:
    with pytest.raises(APIError, match="at least one non-empty user or assistant message"):
        anthropic.build_request(UP, "chat", {"messages": [{"role": "system", "content": "x"}]})


def test_a_tool_use_answer_comes_back_with_its_tool_calls() -> None:
    out = anthropic.parse_response("chat", {
        "id": "m", "model": "c", "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 2},
        "content": [{"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                    {"type": "tool_use", "id": "t2", "name": "g", "input": {}}]})
    choice = out["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Checking."
    assert choice["message"]["tool_calls"] == [
        {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
    only_call = anthropic.parse_response("chat", {"content": [{"type": "tool_use", "id": "t", "name": "f",
                                                               "input": {}}], "stop_reason": "tool_use"})
    assert only_call["choices"][0]["message"]["content"] is None  # as OpenAI answers a call without text


@pytest.mark.parametrize(("stop", "finish"), [("end_turn", "stop"), ("max_tokens", "length"),
                                               ("tool_use", "tool_calls"), ("refusal", "content_filter"),
                                               ("stop_sequence", "stop")])
def test_stop_reasons_map_to_finish_reasons(stop: str, finish: str) -> None:
    out = anthropic.parse_response("chat", {"content": [{"type": "text", "text": "x"}], "stop_reason": stop})
    assert out["choices"][0]["finish_reason"] == finish


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def test_a_streamed_tool_use_becomes_tool_call_deltas() -> None:
    raw = sse(
        {"type": "message_start", "message": {"id": "m", "model": "c", "usage": {"input_tokens": 3}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "On it."}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "f",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": '{"x"'}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": ": 1}"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "t2", "name": "g",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}},
        {"type": "message_stop"},
    )
    t = anthropic.StreamTranslator()
    out = [o for i in range(0, len(raw), 50) for o in t.feed(raw[i:i + 50])]  # arbitrary splits are buffered
    assert out[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(o[6:]) for o in out[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            entry = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            entry["id"] += tc.get("id", "")
            entry["name"] += tc.get("function", {}).get("name", "")
            entry["arguments"] += tc["function"].get("arguments", "")
    assert calls == {0: {"id": "t1", "name": "f", "arguments": '{"x": 1}'},
                     1: {"id": "t2", "name": "g", "arguments": "{}"}}
    assert "".join(d.get("content") or "" for d in deltas) == "On it."
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == 9


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}, "tools"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": "f"}}, "tool_choice"),
        ({"messages": [*USER, {"role": "assistant", "tool_calls": {"id": "c"}}]}, "messages[1].tool_calls"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0]"),
        ({"messages": "hi"}, "messages"),
    ],
)
def test_malformed_fields_are_a_400_not_a_crash(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as err:
        anthropic.build_request(UP, "chat", {"model": "r", "messages": USER, **body})
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("shape", [None, 1, "x", [], {}, [1], [{"type": "text", "text": 1}]])
def test_an_answer_of_an_odd_shape_parses_or_raises_what_the_caller_retries(shape: Any) -> None:
    try:
        out = anthropic.parse_response("chat", {"content": shape, "usage": shape, "stop_reason": "end_turn"})
    except (KeyError, TypeError, ValueError):
        return  # the caller counts it as an upstream answer of an unexpected shape
    assert out["choices"][0]["message"]["content"] == "" and out["usage"]["total_tokens"] == 0


def test_a_stream_event_that_never_ends_is_refused_not_buffered_forever() -> None:
    t = anthropic.StreamTranslator()
    with pytest.raises(ValueError, match="without ending"):
        for _ in range(anthropic.MAX_EVENT_BYTES // 2**16 + 2):
            t.feed(b"x" * 2**16)
