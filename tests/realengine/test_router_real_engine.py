"""The router in front of real vLLM (the tiny model on CPU): chat and completions, streamed and not;
logprobs driving escalation.on_answer.min_mean_logprob; usage with cached prompt tokens; vLLM's own errors
relayed with their status and shape; a client that leaves stops the engine generating; token limits
metered from the engine's real usage."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import realvllm
import yaml
from e2e_support import eventually
from fake_upstreams import Script, Server, openai_app
from prometheus_client import generate_latest

from oculis_router.app import build_app

# A prompt of a few hundred tokens: CPU blocks hold 128 tokens, so it fills two and a repeat hits the cache.
LONG = " ".join(f"def f{i}(x): return x * {i}" for i in range(40))


class Routed:
    def __init__(self, server: Server, app: Any, engine: realvllm.Engine, backup: Script) -> None:
        self.url, self.app, self.engine, self.backup = server.url, app, engine, backup

    def post(self, path: str, **body: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=120)

    def metrics(self) -> str:
        return generate_latest(self.app.state.metrics.registry).decode()


def config(engine_url: str, backup_url: str) -> dict[str, Any]:
    tiny = {"name": "tiny", "provider": "vllm", "base_url": engine_url + "/v1", "model": realvllm.SERVED_NAME,
            "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cached_input_per_mtok": 0.5}}
    backup = {"name": "backup", "provider": "vllm", "base_url": backup_url + "/v1", "model": "backup"}
    plain = {"escalation": {"enabled": False}, "cache": {"enabled": False}}
    return {"oculis": {
        "upstreams": [tiny, backup, {**tiny, "name": "wrong-model", "model": "no-such-model"}],
        "routes": [
            {"name": "real", "tiers": [{"name": "only", "upstream": "tiny"}], **plain},
            {"name": "unknown", "tiers": [{"name": "only", "upstream": "wrong-model"}], **plain},
            # Every answer of the gibberish model is unsure at -0.01 and sure at -50.
            {"name": "strict", "cache": {"enabled": False}, "tiers": [
                {"name": "small", "match": {"complexity_below": 1.0}, "upstream": "tiny"},
                {"name": "big", "upstream": "backup"}],
             "escalation": {"enabled": True, "on_low_confidence": False, "on_answer": {"min_mean_logprob": -0.01}}},
            {"name": "lenient", "cache": {"enabled": False}, "tiers": [
                {"name": "small", "match": {"complexity_below": 1.0}, "upstream": "tiny"},
                {"name": "big", "upstream": "backup"}],
             "escalation": {"enabled": True, "on_low_confidence": False, "on_answer": {"min_mean_logprob": -50}}},
            {"name": "metered", "tiers": [{"name": "only", "upstream": "tiny"}], **plain,
             "limits": {"per": "route", "tokens_per_minute": 400}},
        ]}}


@pytest.fixture(scope="module")
def routed(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Routed]:
    engine = engines.get("default")
    backup = Script(reply="from the backup tier")
    with Server(openai_app("backup", backup)) as bserver:
        path = tmp_path_factory.mktemp("router") / "oculis-config.yaml"
        path.write_text(yaml.safe_dump(config(engine.url, bserver.url)))
        app = build_app(config_path=path, reload_interval=0.5, backoff=0.001)
        with Server(app) as server:
            yield Routed(server, app, engine, backup)


def engine_gauge(engine: realvllm.Engine, name: str) -> float:
    m = re.search(rf"^vllm:{name}\{{[^}}]*\}} ([0-9.e+-]+)$", engine.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def engine_counter(engine: realvllm.Engine, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^vllm:{name}_total\{{[^}}]*\}} ([0-9.e+-]+)$", engine.metrics(), re.M))


def test_chat_and_completions_streamed_and_not(routed: Routed) -> None:
    chat = routed.post("/v1/chat/completions", model="real", max_tokens=8,
                       messages=[{"role": "user", "content": "hello"}])
    assert chat.status_code == 200, chat.text
    body = chat.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 8 and body["usage"]["prompt_tokens"] > 0
    comp = routed.post("/v1/completions", model="real", prompt="def main():", max_tokens=5)
    assert comp.status_code == 200, comp.text
    assert comp.json()["object"] == "text_completion" and comp.json()["usage"]["completion_tokens"] == 5
    for path, req in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                      ("/v1/completions", {"prompt": "import os"})):
        body = {"model": "real", "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}, **req}
        with httpx.stream("POST", routed.url + path, timeout=120, json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == 6, chunks[-1]


def test_real_logprobs_drive_answer_escalation(routed: Routed) -> None:
    ask = {"messages": [{"role": "user", "content": "say something"}], "max_tokens": 8}
    unsure = routed.post("/v1/chat/completions", model="strict", **ask)
    assert unsure.status_code == 200, unsure.text
    assert (unsure.headers["x-oculis-tier"], unsure.headers["x-oculis-escalation-reason"]) == ("big", "answer")
    assert float(unsure.headers["x-oculis-answer-logprob"]) < -0.01  # the real engine's mean token logprob
    assert unsure.json()["choices"][0]["message"]["content"].startswith("from the backup tier")
    sure = routed.post("/v1/chat/completions", model="lenient", **ask)
    assert sure.status_code == 200 and sure.headers["x-oculis-tier"] == "small"
    assert -50 < float(sure.headers["x-oculis-answer-logprob"]) < 0
    # A client that asked for logprobs gets the engine's own, in vLLM's shape.
    own = routed.post("/v1/chat/completions", model="real", logprobs=True, top_logprobs=2, **ask)
    content = own.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == 8 and {"token", "logprob", "bytes", "top_logprobs"} <= set(content[0])
    assert len(content[0]["top_logprobs"]) == 2


def test_usage_reports_cached_prompt_tokens_and_the_router_prices_them(routed: Routed) -> None:
    first = routed.post("/v1/completions", model="real", prompt=LONG, max_tokens=2)
    again = routed.post("/v1/completions", model="real", prompt=LONG, max_tokens=2)
    assert first.status_code == again.status_code == 200, again.text
    usage = again.json()["usage"]
    assert usage["prompt_tokens"] > 256
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 128 and cached % 128 == 0, usage  # whole CPU blocks of the repeated prefix
    assert re.search(r'oculis_cached_prompt_tokens_total\{upstream="tiny"\} [1-9]', routed.metrics()), \
        [ln for ln in routed.metrics().splitlines() if "cached" in ln]


@pytest.mark.parametrize(("route", "body", "status", "param"), [
    ("real", {"prompt": LONG * 4, "max_tokens": 4}, 400, "input_tokens"),  # longer than max_model_len 512
    ("unknown", {"prompt": "x", "max_tokens": 2}, 404, "model"),  # the engine serves no such model
    ("real", {"prompt": "x", "max_tokens": 2, "temperature": -1}, 400, "temperature"),
])
def test_the_engines_errors_are_relayed_with_status_and_shape(routed: Routed, route: str, body: dict[str, Any],
                                                              status: int, param: str) -> None:
    direct = httpx.post(routed.engine.url + "/v1/completions", timeout=60,
                        json={**body, "model": "no-such-model" if route == "unknown" else realvllm.SERVED_NAME})
    relayed = routed.post("/v1/completions", model=route, **body)
    assert direct.status_code == status, direct.text
    assert relayed.status_code == status, relayed.text
    assert direct.json()["error"]["param"] == param, direct.text
    # vLLM's own error object, whole: message, type, param and code.
    assert relayed.json()["error"] == direct.json()["error"], (relayed.text, direct.text)


async def leave_mid_answer(url: str, body: dict[str, Any], after_s: float) -> str:
    """Send `body` and go away mid-answer: a stream after its 6th line, a whole answer `after_s` in.
    Returns how the try went: "left", or what came back when the answer was done before the client went."""
    async with httpx.AsyncClient(timeout=120) as client:
        if body.get("stream"):
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                lines = []
                async for ln in r.aiter_lines():
                    lines.append(ln)
                    if len(lines) == 7:
                        break
            return "left" if len(lines) == 7 else f"stream {r.status_code} of {len(lines)} lines: {lines[-1:]}"
        call = asyncio.create_task(client.post(url + "/v1/completions", json=body))
        done, _ = await asyncio.wait([call], timeout=after_s)
        if done:
            r = call.result()
            return f"answer {r.status_code} within {after_s:.2f} s: {r.text[:160]}"
        call.cancel()  # the client goes away: its connection to the router is closed
        with contextlib.suppress(asyncio.CancelledError):
            await call
        return "left"


def test_a_client_that_leaves_stops_the_engine_generating(routed: Routed) -> None:
    engine = routed.engine
    want = 480
    body = {"model": "real", "prompt": "x", "max_tokens": want, "ignore_eos": True}
    # A non-streamed client leaves on a clock set by this machine's own pace: a quarter of a whole answer's
    # time (the router watches a client from 0.25 s on), so a fast machine cannot finish first.
    t0 = time.perf_counter()
    assert routed.post("/v1/completions", **body).status_code == 200
    after_s = max(0.3, (time.perf_counter() - t0) / 4)
    # With vLLM's threads bound to a core, this 2-core machine starved every other process for a whole
    # generation (realvllm.engine_env unbinds them): a client or a router that gets no CPU cannot leave or
    # see it in time. Each case gets up to 5 tries; one abandoned request the engine stops early shows the
    # router closed its call, and every try is reported if none does.
    for stream in (True, False):
        tries = []
        for _ in range(5):
            before = engine_counter(engine, "generation_tokens")
            how = asyncio.run(leave_mid_answer(routed.url, {**body, "stream": stream}, after_s))
            eventually(lambda: engine_gauge(engine, "num_requests_running") == 0, timeout=60,
                       what="the engine to finish or drop the abandoned request")
            tries.append((how, engine_counter(engine, "generation_tokens") - before))
            if how == "left" and tries[-1][1] < want:
                break
        print(f"realengine: a client that leaves (stream={stream}, after {after_s:.2f} s): {tries}")
        assert tries[-1][0] == "left" and tries[-1][1] < want, \
            f"stream={stream}: no try where the client left stopped the engine before {want} tokens: {tries}"
    # the router's side of it, whatever the engine did: each abandoned answer counted as the client's doing
    assert re.search(r'oculis_requests_total\{[^}]*outcome="client_closed"[^}]*\} [1-9]', routed.metrics())


def test_a_token_limit_is_metered_from_the_engines_real_usage(routed: Routed) -> None:
    # 400 tokens a minute for the route: each answer reserves prompt + max_tokens, then settles at the
    # engine's real usage, so answers that stop early leave room for more.
    ok, refused = 0, 0
    for _ in range(12):
        r = routed.post("/v1/completions", model="metered", prompt="def f(x):", max_tokens=40, ignore_eos=True)
        if r.status_code == 429:
            refused += 1
            assert "retry-after" in r.headers
        else:
            assert r.status_code == 200, r.text
            ok += 1
    # 40 output + a few prompt tokens each: 400 admits 8 or 9, never all 12.
    assert 7 <= ok <= 9 and refused == 12 - ok


def test_concurrent_clients_through_the_router_see_the_engines_own_counts(routed: Routed) -> None:
    results: list[int] = []

    def one() -> None:
        r = routed.post("/v1/completions", model="real", prompt="class A:", max_tokens=16, ignore_eos=True)
        results.append(r.json()["usage"]["completion_tokens"] if r.status_code == 200 else -r.status_code)

    before = engine_counter(routed.engine, "generation_tokens")
    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [16] * 6
    assert engine_counter(routed.engine, "generation_tokens") - before == 96
