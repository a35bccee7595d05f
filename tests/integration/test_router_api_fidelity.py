"""OpenAI API fidelity over real HTTP, driven by the openai SDK: what the upstream receives is what the
client sent (or a 400 naming what a provider cannot take), and what the client gets back is what the
upstream answered: tool calls, content types, request ids, SSE headers proxies respect."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml
from fake_upstreams import Recorder, Server, fidelity_anthropic_app, fidelity_openai_app

from oculis_router.app import build_app

PNG = "iVBORw0KGgo="  # enough of a PNG for a fake
CITY: dict[str, Any] = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER: dict[str, Any] = {"type": "function",
           "function": {"name": "get_weather", "description": "Weather in a city", "parameters": CITY}}


class Env:
    def __init__(self, url: str, oa: Recorder, anth: Recorder) -> None:
        self.url, self.oa, self.anth = url, oa, anth
        # Any: the SDK's typed overloads cannot express the extension fields these tests send.
        self.client: Any = openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0, timeout=30)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(self.url + "/v1/" + path, json=body, timeout=30)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    oa, anth = Recorder(), Recorder()
    with Server(fidelity_openai_app(oa)) as o, Server(fidelity_anthropic_app(anth)) as a:
        def tier(name: str, upstream: str, below: float | None = None, **kw: Any) -> dict[str, Any]:
            return {"name": name, "upstream": upstream, "match": {} if below is None else {"complexity_below": below},
                    **kw}

        cfg = {"oculis": {
            "upstreams": [
                {"name": "vllm", "provider": "vllm", "base_url": o.url + "/v1", "model": "llama"},
                {"name": "vision", "provider": "vllm", "base_url": o.url + "/v1", "model": "llava"},
                {"name": "claude", "provider": "anthropic", "base_url": a.url + "/v1", "model": "claude-x"},
            ],
            "routes": [
                {"name": "adaptive", "tiers": [tier("small", "vllm", 0.9), tier("big", "vllm")]},
                # The chosen tier is Anthropic for any short prompt; completions must skip it.
                {"name": "claude-first", "escalation": {"on_low_confidence": False},
                 "tiers": [tier("claude", "claude", 0.99), tier("llama", "vllm")]},
                {"name": "claude-only", "tiers": [tier("only", "claude")]},
                {"name": "cached", "tiers": [tier("only", "claude")], "cache": {"enabled": True}},
                {"name": "multimodal", "escalation": {"on_low_confidence": False},
                 "tiers": [tier("text", "vllm", 0.99), tier("eyes", "vision", modalities=["text", "image"])]},
            ],
        }}
        path = tmp_path_factory.mktemp("fidelity") / "oculis-config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        with Server(build_app(config_path=path, reload_interval=60, backoff=0.001)) as router:
            yield Env(router.url, oa, anth)


@pytest.fixture(autouse=True)
def fresh(env: Env) -> None:
    for rec in (env.oa, env.anth):
        rec.__init__()  # the fakes hold these objects: reset in place


USER = [{"role": "user", "content": "hi"}]
EXTRAS = {"top_k": 5, "repetition_penalty": 1.1, "min_p": 0.05, "guided_json": {"type": "object"},
          "prompt_cache_key": "tenant-a", "verbosity": "low", "safety_identifier": "u-1",
          "chat_template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize("model", ["vllm", "adaptive"])
def test_openai_compatible_upstreams_receive_every_field_the_client_sent(env: Env, model: str) -> None:
    env.client.chat.completions.create(model=model, messages=USER, extra_body=EXTRAS)
    sent = env.oa.received[-1]
    assert {k: sent[k] for k in EXTRAS} == EXTRAS
    # Legacy function calling too (the SDK still sends it), and completions' own extensions.
    env.client.chat.completions.create(model=model, messages=USER,
                                       functions=[WEATHER["function"]], function_call="auto")
    assert env.oa.received[-1]["functions"] == [WEATHER["function"]]
    env.client.completions.create(model=model, prompt="x", extra_body={"top_k": 3, "guided_regex": "a+"})
    assert env.oa.received[-1]["top_k"] == 3 and env.oa.received[-1]["guided_regex"] == "a+"


@pytest.mark.parametrize("nulls", [{"n": None}, {"stream": None}, {"temperature": None, "max_tokens": None},
                                   {"tools": None, "tool_choice": None, "stop": None}])
def test_null_means_unset(env: Env, nulls: dict[str, Any]) -> None:
    for model in ("vllm", "claude"):
        r = env.post("chat/completions", {"model": model, "messages": USER, **nulls})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
    assert not set(nulls) & set(env.oa.received[-1])  # unset, so not forwarded as null either
    assert env.anth.received[-1]["max_tokens"] == 1024  # Anthropic's required field: the upstream's default


def test_models_retrieve_returns_the_model_object(env: Env) -> None:
    m = env.client.models.retrieve("vllm")
    assert (m.id, m.object) == ("vllm", "model")
    assert env.client.models.retrieve("adaptive").id == "adaptive"
    with pytest.raises(openai.NotFoundError) as err:
        env.client.models.retrieve("nope")
    assert err.value.body["code"] == "model_not_found"  # type: ignore[index]


@pytest.mark.parametrize("model", ["vllm", "adaptive", "claude"])
def test_streams_carry_headers_proxies_respect(env: Env, model: str) -> None:
    body = {"model": model, "stream": True, "messages": USER}
    with httpx.stream("POST", env.url + "/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        assert r.headers["x-request-id"] == "req-fake-1"  # the provider's id, for support and logs
        r.read()


def test_a_cached_stream_replay_carries_the_sse_headers_too(env: Env) -> None:
    env.anth.tool_use = {"name": "get_weather", "input": {"city": "Lyon"}}
    body = {"model": "cached", "messages": USER, "temperature": 0, "tools": [WEATHER]}
    assert env.post("chat/completions", body).headers["x-oculis-cache"] == "miss"
    with httpx.stream("POST", env.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=30) as r:
        assert r.headers["x-oculis-cache"] == "hit"
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        text = r.read().decode()
    assert '"get_weather"' in text and "tool_calls" in text  # the translated call replays, not an empty turn
    assert len(env.anth.received) == 1


@pytest.mark.parametrize(("model", "stream"), [("vllm", False), ("adaptive", False), ("claude", False),
                                               ("claude", True)])
def test_upstream_request_ids_and_rate_limits_reach_the_client(env: Env, model: str, stream: bool) -> None:
    r = env.post("chat/completions", {"model": model, "messages": USER, "stream": stream})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "req-fake-1"
    assert r.headers["x-ratelimit-remaining-requests"] == "99" and r.headers["x-ratelimit-limit-tokens"] == "30000"
    assert r.headers["anthropic-ratelimit-requests-remaining"] == "49"


def test_relayed_upstream_errors_keep_their_content_type(env: Env) -> None:
    env.oa.html_error = 404
    for stream in (False, True):
        r = env.post("chat/completions", {"model": "vllm", "messages": USER, "stream": stream})
        assert r.status_code == 404 and r.headers["content-type"].startswith("text/html")
        assert r.text.startswith("<html>") and r.headers["x-request-id"] == "req-fake-1"


def test_a_direct_call_sends_no_empty_route_header(env: Env) -> None:
    direct = env.post("chat/completions", {"model": "vllm", "messages": USER})
    assert "x-oculis-route" not in direct.headers and direct.headers["x-oculis-tier"] == "direct"
    assert env.post("chat/completions", {"model": "adaptive", "messages": USER}).headers["x-oculis-route"] == \
        "adaptive"


# ---- Anthropic ---------------------------------------------------------------------------------------

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Weather here?"},
                                 {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
                                 {"type": "image_url", "image_url": {"url": "https://example.com/sky.jpg"}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
]


def test_anthropic_tools_tool_results_and_images_are_translated(env: Env) -> None:
    env.anth.tool_use = {"name": "get_weather", "input": {"city": "Lyon"}}
    resp = env.client.chat.completions.create(model="claude", messages=CONVERSATION,
                                              tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    sent = env.anth.received[-1]
    assert sent["system"] == [{"type": "text", "text": "Be brief."}]
    assert sent["tools"] == [{"name": "get_weather", "description": "Weather in a city",
                              "input_schema": WEATHER["function"]["parameters"]}]
    assert sent["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["messages"][0]["content"][1:] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/sky.jpg"}}]
    assert sent["messages"][1]["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert sent["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "call_1",
                                               "content": "sunny, 21 C"}]
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("toolu_1", "get_weather",
                                                                                   {"city": "Lyon"})


def test_anthropic_streamed_tool_use_becomes_openai_tool_call_deltas(env: Env) -> None:
    env.anth.tool_use = {"name": "get_weather", "input": {"city": "Lyon"}}
    stream = env.client.chat.completions.create(model="claude", messages=USER, tools=[WEATHER],
                                                stream=True)
    text, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            for tc in c.delta.tool_calls or []:
                entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = tc.id or entry["id"]
                if tc.function:
                    entry["name"] += tc.function.name or ""
                    entry["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    assert text == "Let me check." and finish == "tool_calls"
    assert list(calls.values()) == [{"id": "toolu_1", "name": "get_weather", "arguments": '{"city": "Lyon"}'}]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"reasoning_effort": "high"}, "reasoning_effort"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name"),
        ({"seed": 7}, "seed"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
        ({"functions": [WEATHER["function"]]}, "functions"),
        ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/tiff;"
                                                                                          "base64,AA"}}]}]},
         "messages[0].content[0].image_url.url"),
    ],
)
def test_anthropic_refuses_what_it_cannot_translate_by_name(env: Env, extra: dict[str, Any], field: str) -> None:
    r = env.post("chat/completions", {"model": "claude", "messages": USER, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"] and "anthropic" in err["message"]
    assert env.anth.received == []  # refused before any call: no answer to a different question


def test_defaults_anthropic_cannot_change_are_accepted(env: Env) -> None:
    r = env.post("chat/completions", {"model": "claude", "messages": USER, "n": 1, "logprobs": False,
                                      "presence_penalty": 0, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text


def test_completions_skip_anthropic_tiers_or_say_why(env: Env) -> None:
    r = env.client.completions.with_raw_response.create(model="claude-first", prompt="Say hi")
    assert r.headers["x-oculis-tier"] == "llama" and r.parse().choices[0].text == "ok"
    assert env.anth.received == [] and env.oa.received[-1]["prompt"] == "Say hi"
    chat = env.client.chat.completions.with_raw_response.create(model="claude-first", messages=USER)
    assert chat.headers["x-oculis-tier"] == "claude"  # chat still goes to the chosen Anthropic tier
    r2 = env.post("completions", {"model": "claude-only", "prompt": "x"})
    assert r2.status_code == 400 and r2.json()["error"]["code"] == "unsupported_endpoint"


def test_a_route_skips_an_anthropic_tier_that_cannot_take_the_request(env: Env) -> None:
    body = {"model": "claude-first", "messages": USER, "response_format": {"type": "json_object"}}
    r = env.post("chat/completions", body)
    assert r.status_code == 200 and r.headers["x-oculis-tier"] == "llama"
    assert env.oa.received[-1]["response_format"] == {"type": "json_object"} and env.anth.received == []
    r = env.post("chat/completions", {**body, "model": "claude-only"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert "claude-only" in r.json()["error"]["message"] and "anthropic" in r.json()["error"]["message"]


def test_an_image_prompt_goes_to_a_tier_that_takes_images(env: Env) -> None:
    image = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]
    r = env.post("chat/completions", {"model": "multimodal", "messages": image})
    assert (r.headers["x-oculis-tier"], r.headers["x-oculis-upstream"]) == ("eyes", "vision")
    assert env.oa.received[-1]["model"] == "llava"
    assert env.post("chat/completions", {"model": "multimodal", "messages": USER}).headers["x-oculis-tier"] == "text"
