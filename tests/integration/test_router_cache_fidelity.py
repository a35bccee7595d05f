"""The response cache over real HTTP, driven by the openai SDK: it never serves an answer to a
different question, and what it serves is exactly what was answered, streamed or not, whichever way
it was cached. The route keeps the old allow-list `cache.key: [model, messages, temperature]` of the
example config, which must not narrow the key."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from router_support import Fakes, RouterHandle

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
BASE: dict[str, Any] = {"model": "adaptive", "temperature": 0,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]}


@pytest.fixture(autouse=True)
def answers_depend_on_the_request(fakes: Fakes) -> None:
    for name in ("small", "large", "frontier"):
        s = fakes.scripts[name]
        s.echo_question = s.call_tools = s.give_logprobs = True


def upstream_calls(fakes: Fakes) -> int:
    return sum(len(fakes.scripts[n].received) for n in ("small", "large", "frontier"))


def complete(router: RouterHandle, prompt: str, **kw: Any) -> Any:
    return router.client.completions.with_raw_response.create(model="adaptive", prompt=prompt, temperature=0, **kw)


def chat(router: RouterHandle, **kw: Any) -> Any:
    return router.client.chat.completions.with_raw_response.create(**{**BASE, **kw})


def streamed_chat(router: RouterHandle, **kw: Any) -> tuple[str, Any]:
    """The cache header and the completion the SDK's own accumulator rebuilds from the stream."""
    raw = chat(router, stream=True, **kw)
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for c in raw.parse():
        assert c.object == "chat.completion.chunk"
        state.handle_chunk(c)
    return raw.headers["x-oculis-cache"], state.get_final_completion()


def test_completions_prompts_never_share_an_answer(router: RouterHandle) -> None:
    france = complete(router, "Capital of France?")
    sea = complete(router, "Write a poem about the sea")
    assert (france.headers["x-oculis-cache"], sea.headers["x-oculis-cache"]) == ("miss", "miss")
    assert "Write a poem about the sea" in sea.parse().choices[0].text
    again = complete(router, "Capital of France?")
    assert again.headers["x-oculis-cache"] == "hit"
    assert again.parse().model_dump() == france.parse().model_dump()
    for variant in ({"suffix": " is the answer."}, {"echo": True}, {"logit_bias": {"50256": -100}}, {"best_of": 2},
                    {"max_tokens": 3}):
        assert complete(router, "Capital of France?", **variant).headers["x-oculis-cache"] == "miss", variant


def test_completions_replay_as_text_completion_objects_and_chunks_both_ways(router: RouterHandle) -> None:
    whole = complete(router, "Capital of France?").parse()
    raw = complete(router, "Capital of France?", stream=True)
    assert raw.headers["x-oculis-cache"] == "hit"
    chunks = list(raw.parse())
    assert {c.object for c in chunks} == {"text_completion"}
    assert "".join(ch.text for c in chunks for ch in c.choices) == whole.choices[0].text
    assert [ch.finish_reason for c in chunks for ch in c.choices][-1] == "stop"
    # Cached from a stream, replayed whole.
    live = "".join(ch.text for c in complete(router, "Capital of Spain?", stream=True).parse() for ch in c.choices)
    hit = complete(router, "Capital of Spain?")
    assert hit.headers["x-oculis-cache"] == "hit"
    replayed = hit.parse()
    assert replayed.object == "text_completion" and replayed.choices[0].text == live
    assert replayed.usage is not None and replayed.usage.total_tokens == 8


def test_tool_calls_survive_the_cache_from_a_stream_to_a_whole_answer(router: RouterHandle) -> None:
    header, live = streamed_chat(router, tools=TOOLS)
    assert header == "miss" and live.choices[0].message.tool_calls
    raw = chat(router, tools=TOOLS)
    assert raw.headers["x-oculis-cache"] == "hit"
    choice = raw.parse().choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, call.function.arguments) == ("call_1", "get_weather", '{"city": "Paris"}')


def test_tool_calls_survive_the_cache_from_a_whole_answer_to_a_stream(router: RouterHandle) -> None:
    first = chat(router, tools=TOOLS).parse().choices[0]
    header, replayed = streamed_chat(router, tools=TOOLS)
    assert header == "hit"
    assert replayed.choices[0].finish_reason == "tool_calls"
    def calls(message: Any) -> list[tuple[str, str, str, str]]:
        return [(c.id, c.type, c.function.name, c.function.arguments) for c in message.tool_calls]

    assert calls(replayed.choices[0].message) == calls(first.message) != []


def test_logprobs_survive_the_cache_both_ways(router: RouterHandle) -> None:
    whole = chat(router, logprobs=True).parse().choices[0]
    header, replayed = streamed_chat(router, logprobs=True)
    assert header == "hit"
    assert [t.token for t in replayed.choices[0].logprobs.content] == [t.token for t in whole.logprobs.content]
    header, live = streamed_chat(router, logprobs=True, seed=3)
    hit = chat(router, logprobs=True, seed=3)
    assert (header, hit.headers["x-oculis-cache"]) == ("miss", "hit")
    tokens = [t.token for t in live.choices[0].logprobs.content]
    assert [t.token for t in hit.parse().choices[0].logprobs.content] == tokens


ANSWER_CHANGING: dict[str, dict[str, Any]] = {
    "response_format": {"response_format": {"type": "json_object"}},
    "max_tokens": {"max_tokens": 5},
    "stop": {"stop": ["\n"]},
    "seed": {"seed": 7},
    "top_p": {"top_p": 0.5},
    "logprobs": {"logprobs": True},
    "tools": {"tools": TOOLS},
    "tool_choice": {"tools": TOOLS, "tool_choice": "none"},
    "system prompt": {"messages": [{"role": "system", "content": "Answer in French."}, BASE["messages"][1]]},
    "a vLLM extension": {"extra_body": {"top_k": 1}},
}
ANSWER_NEUTRAL: dict[str, dict[str, Any]] = {
    "user": {"user": "end-user-42"},
    "metadata": {"metadata": {"team": "search"}},
    "store": {"store": False},
}


def test_answer_changing_fields_never_hit_and_neutral_ones_do(router: RouterHandle, fakes: Fakes) -> None:
    assert chat(router).headers["x-oculis-cache"] == "miss"
    assert chat(router).headers["x-oculis-cache"] == "hit"
    for name, variant in ANSWER_CHANGING.items():
        calls = upstream_calls(fakes)
        assert chat(router, **variant).headers["x-oculis-cache"] == "miss", name
        assert upstream_calls(fakes) == calls + 1, name
    for name, variant in ANSWER_NEUTRAL.items():
        assert chat(router, **variant).headers["x-oculis-cache"] == "hit", name


def test_a_stream_without_its_usage_chunk_is_not_cached(router: RouterHandle, fakes: Fakes) -> None:
    # A non-streamed replay must carry usage, which a stream from an engine that reports none never had:
    # not stored, not served.
    fakes.scripts["small"].no_usage = True
    header, _ = streamed_chat(router)
    assert header == "miss"
    fakes.scripts["small"].no_usage = False
    assert chat(router).headers["x-oculis-cache"] == "miss"
    assert chat(router).headers["x-oculis-cache"] == "hit"
    # ...and a hit replayed to such a client has no usage chunk, as a live stream would.
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", timeout=10,
                      headers={"authorization": "Bearer sk-client"},  # the SDK's key: the same tenant
                      json={**BASE, "stream": True, "stream_options": {"include_usage": False}}) as r:
        assert r.headers["x-oculis-cache"] == "hit"
        assert '"usage"' not in r.read().decode()


def test_a_stream_whose_client_declined_usage_is_cached_all_the_same(router: RouterHandle) -> None:
    # The router asks the upstream for the usage chunk whatever the client set (and strips it for the
    # client), so such a stream is whole and stored.
    header, _ = streamed_chat(router, stream_options={"include_usage": False})
    assert header == "miss"
    assert chat(router).headers["x-oculis-cache"] == "hit"
