"""The router over real HTTP, driven by the openai SDK, against fake upstreams on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from e2e_support import eventually
from prometheus_client import generate_latest
from router_support import Fakes, RouterHandle
from time_scale import Deadline

# A long multiple-choice question: a kind the head has evidence for (MMLU-like), so its length sends it up.
# (A long prompt of a kind it has none for, e.g. open-ended chat, gets the kind guard's coin: classify.coin.)
LONG = ("Which of the following is a consequence of the second law of thermodynamics for a heat engine operating "
        "between two reservoirs?\nA. Its efficiency can reach 100%\nB. Its efficiency is bounded by the Carnot "
        "efficiency\nC. It needs no cold reservoir\nD. Entropy of the universe decreases\nAnswer:") * 4


def chat(router: RouterHandle, content: str, **kw: Any) -> Any:
    return router.client.chat.completions.with_raw_response.create(
        model=kw.pop("model", "adaptive"), messages=[{"role": "user", "content": content}], **kw)


def test_short_prompt_goes_to_the_cheapest_tier_long_one_up(router: RouterHandle, fakes: Fakes) -> None:
    raw = chat(router, "hi")
    assert raw.headers["x-oculis-route"] == "adaptive"
    assert (raw.headers["x-oculis-tier"], raw.headers["x-oculis-upstream"]) == ("simple", "llama-8b")
    assert raw.parse().choices[0].message.content == "hello from small"
    assert fakes.scripts["small"].received[0]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    raw = chat(router, LONG)
    assert raw.headers["x-oculis-tier"] in ("standard", "complex")
    assert float(raw.headers["x-oculis-complexity"]) > 0.35
    big = chat(router, "word " * 2500)  # over max_prompt_tokens of the simple tier
    assert big.headers["x-oculis-tier"] != "simple"


def test_naming_an_upstream_goes_straight_there(router: RouterHandle) -> None:
    raw = chat(router, "hi", model="llama-70b")
    assert raw.headers["x-oculis-upstream"] == "llama-70b" and raw.headers["x-oculis-tier"] == "direct"
    models = router.client.models.list()
    assert {"adaptive", "via-claude", "llama-8b", "llama-70b", "gpt4o", "claude"} <= {m.id for m in models.data}


def test_completions_endpoint(router: RouterHandle) -> None:
    raw = router.client.completions.with_raw_response.create(model="adaptive", prompt="Say hi")
    assert raw.parse().choices[0].text == "hello from small"


def test_completions_to_an_anthropic_upstream_is_a_400_not_a_500(router: RouterHandle) -> None:
    for model, stream in (("claude", False), ("via-claude", False), ("claude", True)):
        r = httpx.post(router.server.url + "/v1/completions", json={"model": model, "prompt": "hi", "stream": stream})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "unsupported_endpoint" and "/v1/chat/completions" in err["message"]


def test_streaming_passes_through_before_the_upstream_finishes(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].stream_delay = 0.3
    fakes.scripts["small"].reply = "one two three four"
    stream = router.client.chat.completions.create(model="adaptive", messages=[{"role": "user", "content": "hi"}],
                                                   stream=True)
    done_at_first_piece, text = None, ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            if done_at_first_piece is None:
                done_at_first_piece = fakes.scripts["small"].streams_done
            text += chunk.choices[0].delta.content
    assert text.strip() == "one two three four from small"
    assert done_at_first_piece == 0  # the first piece reached the client while the upstream was still streaming
    assert fakes.scripts["small"].streams_done == 1


def test_a_client_that_goes_away_mid_stream_stops_the_upstream(router: RouterHandle, fakes: Fakes) -> None:
    # An abandoned stream must not keep a GPU generating: the router closes its upstream connection.
    fakes.scripts["small"].stream_delay = 0.2
    fakes.scripts["small"].reply = " ".join(["word"] * 100)  # ~20 s if read to the end
    body = {"model": "adaptive", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", json=body, timeout=10) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # first chunk read; leaving the block closes the connection
    eventually(lambda: fakes.scripts["small"].streams_cut, timeout=5, interval=0.05,
               what="the upstream to see its stream cut after the client left")
    text = generate_latest(router.app.state.metrics.registry).decode()
    assert 'outcome="client_closed",route="adaptive",tier="simple",upstream="llama-8b"} 1.0' in text


def test_a_client_that_gives_up_on_a_slow_answer_stops_the_upstream(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].reply_delay = 20  # a long generation
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router.server.url + "/v1/chat/completions", timeout=0.5,
                   json={"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]})
    eventually(lambda: fakes.scripts["small"].streams_cut, timeout=5, interval=0.05,
               what="the upstream to stop generating after the client gave up")
    text = generate_latest(router.app.state.metrics.registry).decode()
    # the tier and upstream it was at, as for a stream the client leaves (QA pass 2, finding 20)
    assert 'oculis_requests_total{outcome="client_closed",route="adaptive",tier="simple",upstream="llama-8b"} 1.0' \
        in text


def test_an_unset_api_key_variable_is_named_and_never_sent_upstream(
        router: RouterHandle, fakes: Fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OCULIS_TEST_OPENAI_KEY")
    r = httpx.post(router.server.url + "/v1/chat/completions",
                   json={"model": "gpt4o", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502
    assert "OCULIS_TEST_OPENAI_KEY is not set in the router's environment" in r.json()["error"]["message"]
    assert fakes.scripts["frontier"].received == []  # no keyless call reached the provider


def test_low_confidence_escalates_one_tier(router: RouterHandle) -> None:
    raw = chat(router, "\U0001f9ff\U0001fa90" * 30)  # unreadable to the classifier: confidence 0
    assert raw.headers["x-oculis-escalated"] == "true"
    assert raw.headers["x-oculis-tier"] == "standard"
    assert chat(router, "hi").headers["x-oculis-escalated"] == "false"


def test_upstream_errors_are_retried_then_escalated(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].fail_times = 1  # one 503, then fine: retried on the same tier
    raw = chat(router, "hi")
    assert raw.headers["x-oculis-upstream"] == "llama-8b" and raw.headers["x-oculis-escalated"] == "false"
    assert len(fakes.scripts["small"].received) == 2
    fakes.scripts["small"].fail_times = 100  # keeps failing: escalated after the retries
    raw = chat(router, "hi again")
    assert raw.headers["x-oculis-upstream"] == "llama-70b" and raw.headers["x-oculis-escalated"] == "true"
    assert raw.parse().choices[0].message.content == "hello from large"
    fakes.scripts["small"].fail_times = 100
    stream = router.client.chat.completions.create(model="adaptive", stream=True,
                                                   messages=[{"role": "user", "content": "stream please"}])
    assert "from large" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_every_tier_failing_is_a_502_not_a_drop(router: RouterHandle, fakes: Fakes) -> None:
    for name in ("small", "large", "frontier"):
        fakes.scripts[name].fail_times = 100
    with pytest.raises(openai.APIStatusError) as err:
        chat(router, "hi")
    assert err.value.status_code == 502
    assert err.value.body["code"] == "upstream_failed"  # type: ignore[index]


def test_client_errors_from_the_upstream_are_relayed(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].fail_times, fakes.scripts["small"].fail_status = 1, 400
    with pytest.raises(openai.BadRequestError):
        chat(router, "hi")
    assert len(fakes.scripts["small"].received) == 1  # a 4xx is not retried


def test_response_cache_hit_miss_bypass_and_tenants(router: RouterHandle, fakes: Fakes) -> None:
    first = chat(router, "cache me", temperature=0)
    assert first.headers["x-oculis-cache"] == "miss"
    second = chat(router, "cache me", temperature=0)
    assert second.headers["x-oculis-cache"] == "hit"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert len(fakes.scripts["small"].received) == 1
    assert chat(router, "cache me", temperature=0.7).headers["x-oculis-cache"] == "bypass"
    other = chat(router, "cache me", temperature=0, extra_headers={"X-Oculis-Tenant": "acme"})
    assert other.headers["x-oculis-cache"] == "miss"  # never another tenant's answer
    other_key = openai.OpenAI(base_url=router.server.url + "/v1", api_key="sk-other", max_retries=0)
    raw = other_key.chat.completions.with_raw_response.create(
        model="adaptive", temperature=0, messages=[{"role": "user", "content": "cache me"}])
    assert raw.headers["x-oculis-cache"] == "miss"  # the API key's tenant differs too
    # Claiming a tenant by header does not reach its answers from another key.
    spoof = other_key.chat.completions.with_raw_response.create(
        model="adaptive", temperature=0, messages=[{"role": "user", "content": "cache me"}],
        extra_headers={"X-Oculis-Tenant": "acme"})
    assert spoof.headers["x-oculis-cache"] == "miss"
    again = chat(router, "cache me", temperature=0, extra_headers={"X-Oculis-Tenant": "acme"})
    assert again.headers["x-oculis-cache"] == "hit"  # the same key and tenant: its own answer
    stream = router.client.chat.completions.with_raw_response.create(
        model="adaptive", temperature=0, stream=True, messages=[{"role": "user", "content": "cache me"}])
    assert stream.headers["x-oculis-cache"] == "hit"
    text = "".join(c.choices[0].delta.content or "" for c in stream.parse() if c.choices)
    assert text == "hello from small"


def test_cache_ttl_and_stream_results_are_cached(router: RouterHandle, fakes: Fakes) -> None:
    cfg = fakes.config(cache={"enabled": True, "ttl_seconds": 1, "max_entries": 10})
    router.write(cfg)
    time.sleep(0.5)
    stream = router.client.chat.completions.create(model="adaptive", temperature=0, stream=True,
                                                   messages=[{"role": "user", "content": "ttl"}])
    assert "from small" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert chat(router, "ttl", temperature=0).headers["x-oculis-cache"] == "hit"  # filled by the stream
    time.sleep(1.3)
    assert chat(router, "ttl", temperature=0).headers["x-oculis-cache"] == "miss"


def test_anthropic_translation_and_cache_control(router: RouterHandle, fakes: Fakes) -> None:
    messages = [{"role": "system", "content": "You are a meticulous legal assistant. " * 50},
                {"role": "user", "content": "First question"}, {"role": "assistant", "content": "First answer"},
                {"role": "user", "content": "Second question"}]
    fakes.scripts["claude"].cached_tokens = 900
    raw = router.client.chat.completions.with_raw_response.create(model="via-claude", messages=messages, max_tokens=50)
    resp = raw.parse()
    assert resp.choices[0].message.content == "bonjour anthropic" and resp.choices[0].finish_reason == "stop"
    assert resp.usage and resp.usage.prompt_tokens == 907 and resp.usage.prompt_tokens_details.cached_tokens == 900
    sent = fakes.scripts["claude"].received[-1]
    assert sent["model"] == "claude-sonnet-4" and sent["max_tokens"] == 50
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert sent["system"][-1]["cache_control"] == {"type": "ephemeral"}
    assert sent["messages"][1]["content"][-1]["cache_control"] == {"type": "ephemeral"}  # longest stable prefix
    assert "cache_control" not in sent["messages"][2]["content"][-1]  # the new turn is not stable
    assert fakes.scripts["claude"].headers[-1]["x-api-key"] == "sk-ant-SECRET-5678"
    fakes.scripts["claude"].cache_written_tokens = 120  # this turn also writes a new prefix
    stream = router.client.chat.completions.create(model="via-claude", messages=messages, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "bonjour anthropic"
    fakes.scripts["claude"].cache_written_tokens = 0
    text = generate_latest(router.app.state.metrics.registry).decode()
    assert 'oculis_cached_prompt_tokens_total{upstream="claude"} 1800.0' in text
    # cache writes have their own counter: `oculis cache advise` reads hits per write from it
    assert 'oculis_cache_write_prompt_tokens_total{upstream="claude"} 120.0' in text


def test_hot_reload_keeps_in_flight_requests_and_rejects_bad_config(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].stream_delay = 0.2
    fakes.scripts["small"].reply = "a b c d e f"
    result: dict[str, str] = {}

    def slow() -> None:
        s = router.client.chat.completions.create(model="adaptive", stream=True,
                                                  messages=[{"role": "user", "content": "hi"}])
        result["text"] = "".join(c.choices[0].delta.content or "" for c in s if c.choices)

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.3)
    cfg = fakes.config()
    cfg["oculis"]["routes"].append({"name": "new-route", "tiers": [{"name": "only", "upstream": "llama-70b"}]})
    router.write(cfg)
    deadline = Deadline(5)
    while not deadline.expired():
        try:
            if chat(router, "hi", model="new-route").headers["x-oculis-upstream"] == "llama-70b":
                break
        except openai.NotFoundError:
            time.sleep(0.1)
    else:
        pytest.fail("new route never appeared")
    t.join(10)
    assert result["text"].strip() == "a b c d e f from small"  # the in-flight stream finished on the old config
    router.path.write_text("oculis: {upstreams: [{name: x}]}\n")  # invalid: rejected, the last good config serves
    rejected = 'oculis_config_reloads_total{result="rejected"} 1.0'
    deadline = Deadline(10)  # the watcher sees the file within its poll interval (longer on a busy CPU)
    while rejected not in generate_latest(router.app.state.metrics.registry).decode():
        assert not deadline.expired(), "the bad config was never counted as rejected"
        time.sleep(0.1)
    assert chat(router, "hi", model="new-route").parse().choices[0].message.content == "hello from large"


@pytest.mark.parametrize(
    ("content", "headers", "status", "code_or_param"),
    [
        (b"{not json", {}, 400, "invalid_json"),
        (json.dumps({"model": "adaptive"}).encode(), {}, 400, "messages"),
        (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "x"}]}).encode(), {}, 404,
         "model_not_found"),
        (json.dumps({"model": "via-claude", "messages": [{"role": "user", "content": "x"}], "seed": 1}).encode(),
         {}, 400, "unsupported_parameter"),  # unknown fields pass through; a provider that cannot take one says so
        (json.dumps({"model": "adaptive", "messages": [{"role": "user", "content": "x"}], "n": 0}).encode(), {}, 400,
         "n"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(), {}, 400, "model"),
        (json.dumps([1, 2]).encode(), {}, 400, None),
        (json.dumps({"model": "adaptive", "messages": [{"role": "user", "content": "x" * 5_000_000}]}).encode(), {},
         413, "request_too_large"),
    ],
)
def test_bad_input_gets_openai_errors(router: RouterHandle, content: bytes, headers: dict[str, str], status: int,
                                      code_or_param: str | None) -> None:
    r = httpx.post(router.server.url + "/v1/chat/completions", content=content,
                   headers={"content-type": "application/json", **headers}, timeout=30)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code_or_param:
        assert code_or_param in (err["code"], err["param"])


def test_unknown_path_and_method_are_json_errors(router: RouterHandle) -> None:
    assert httpx.get(router.server.url + "/v1/nothing").json()["error"]["code"] == "not_found"
    assert httpx.get(router.server.url + "/v1/chat/completions").status_code == 405
    assert httpx.get(router.server.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(router.server.url + "/readyz").json()["status"] == "ready"


def test_metrics_count_requests_tokens_cost_and_keep_secrets_out(router: RouterHandle, fakes: Fakes) -> None:
    chat(router, "hi")
    chat(router, "hi", model="gpt4o")
    assert fakes.scripts["frontier"].headers[-1]["authorization"] == "Bearer sk-openai-SECRET-1234"
    text = generate_latest(router.app.state.metrics.registry).decode()
    for needle in ('oculis_requests_total{outcome="ok",route="adaptive",tier="simple",upstream="llama-8b"} 1.0',
                   'oculis_prompt_tokens_total{upstream="gpt4o"} 10.0', 'oculis_completion_tokens_total',
                   'oculis_cost_dollars_total{upstream="gpt4o"}', "oculis_classification_seconds_bucket",
                   "oculis_upstream_latency_seconds_bucket", 'oculis_cache_lookups_total'):
        assert needle in text
    assert "SECRET" not in text and "sk-client" not in text


def test_a_redis_cache_that_is_down_only_costs_cache_hits(router: RouterHandle, fakes: Fakes) -> None:
    # The cache is an optimisation: with Redis unreachable, deterministic requests are answered as misses.
    from fake_upstreams import free_port

    cfg = fakes.config()
    cfg["oculis"]["server"] = {"cache_backend": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"}
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.config.server.cache_backend == "redis", timeout=10,
               interval=0.05, what="the config to reload")
    for _ in range(2):
        raw = chat(router, "cache me if you can", temperature=0)
        assert raw.headers["x-oculis-cache"] == "miss" and raw.parse().choices[0].message.content
    assert len(fakes.scripts["small"].received) == 2
    # Served as misses, but counted as errors, so an alert (the chart's OculisCacheErrors) can see it.
    text = generate_latest(router.app.state.metrics.registry).decode()
    assert 'oculis_cache_errors_total{backend="redis",op="get"} 2.0' in text
    assert 'oculis_cache_errors_total{backend="redis",op="set"} 2.0' in text


def test_client_keys_when_configured(router: RouterHandle, fakes: Fakes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCULIS_TEST_CLIENT_KEYS", "sk-client, sk-second")
    cfg = fakes.config()
    cfg["oculis"]["server"] = {"client_keys_env": "OCULIS_TEST_CLIENT_KEYS"}
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.config.server.client_keys_env, timeout=10, interval=0.05,
               what="the config to reload")
    url = router.server.url
    body = {"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]}
    assert chat(router, "hi").parse().choices  # the fixture's client sends sk-client
    second = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-second"})
    assert second.status_code == 200
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "sk-client"}):
        r = httpx.post(url + "/v1/chat/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", headers
        assert httpx.get(url + "/v1/models", headers=headers).status_code == 401
    assert httpx.get(url + "/healthz").status_code == 200 and httpx.get(url + "/readyz").status_code == 200
    monkeypatch.setenv("OCULIS_TEST_CLIENT_KEYS", "")  # fails closed
    assert httpx.post(url + "/v1/chat/completions", json=body,
                      headers={"Authorization": "Bearer sk-client"}).status_code == 401
