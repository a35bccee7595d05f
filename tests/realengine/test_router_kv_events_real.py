"""The `kv-events` picker against two real vLLM engines (the tiny model on CPU, prefix caching on, each
publishing its KV events over ZMQ as `--kv-events-config` makes it): with the upstream's `tokenizer` the
router tokenizes each chat as vLLM does (chat template, then the model's tokenizer), so its block keys
equal the token ids in the engines' BlockStored events, and a request sharing a long prefix lands on the
engine that holds those blocks. The engines' own counters prove it: every follow-up is answered with
its shared prefix's whole blocks cached (`usage.prompt_tokens_details.cached_tokens`) by the engine the
group's first request went to, and each engine's `vllm:prefix_cache_hits_total` grew by exactly the
cached tokens of the follow-ups it served. The same traffic through an upstream without `tokenizer`
(text hashing) never matches a real engine's events (no pick for reason `prefix`): that is what the
tokenizer is for. Both engines start once for the module, side by side under the machine's engine lock.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import realvllm
import yaml
from e2e_support import eventually
from fake_upstreams import Server

from oculis_router import model_tokens
from oculis_router.app import build_app
from oculis_router.pick import pick_request

BLOCK = 128  # vLLM's CPU block size (the router scrapes it from cache_config_info)
GROUPS = 4
FOLLOW_UPS = 3
# 16 MiB of KV: 128 blocks of 128 tokens at the tiny model's 1,024 B per token, plenty for these groups
# (no eviction) and ~0.9 GB less resident memory than the tier's 1 GiB per engine.
ENGINE_FLAGS = ("--enable-prefix-caching", "--enable-prompt-tokens-details", "--kv-cache-memory-bytes", "16M")


def _kv_events_config(port: int) -> str:
    # A wildcard endpoint: vLLM binds it (an address would be connected to); the router connects.
    return json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{port}"})


class Pair:
    def __init__(self, engines: list[realvllm.Engine], events: list[str], router: str, app: Any) -> None:
        self.engines, self.events, self.router, self.app = engines, events, router, app
        self.replica_of = {f"{e.url}/v1": e for e in engines}  # x-oculis-replica -> engine

    def chat(self, route: str, body: dict[str, Any]) -> httpx.Response:
        r = httpx.post(self.router + "/v1/chat/completions", json={**body, "model": f"via-{route}"}, timeout=180)
        assert r.status_code == 200, r.text
        return r

    def pool(self, upstream: str) -> Any:
        return self.app.state.fleet.pools[upstream]

    def picks(self, upstream: str, reason: str) -> float:
        return self.app.state.metrics.registry.get_sample_value(
            "oculis_picks_total", {"upstream": upstream, "strategy": "kv-events", "reason": reason}) or 0.0


def _hits(engine: realvllm.Engine) -> float:
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", engine.metrics(), re.M))


@pytest.fixture(scope="module")
def pair(engines: Any, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    engines.close()  # the tier's one engine at a time: this module's two run together, under the lock
    logs = tmp_path_factory.mktemp("kv-events-real")
    with realvllm.engine_lock(), contextlib.ExitStack() as stack:
        zports = [realvllm.free_port(), realvllm.free_port()]
        started = [realvllm.Engine(engines.venv, tiny_model, logs / f"vllm-{i}.log", *ENGINE_FLAGS,
                                   "--kv-events-config", _kv_events_config(z), kv_cache_gib=None)
                   for i, z in enumerate(zports)]
        for e in started:
            stack.callback(e.stop)
        with ThreadPoolExecutor(2) as pool:
            for f in [pool.submit(e.start) for e in started]:
                f.result()
        events = [f"tcp://127.0.0.1:{z}" for z in zports]
        endpoints = [{"url": f"{e.url}/v1", "kv_events": ev} for e, ev in zip(started, events, strict=True)]
        plain = {"escalation": {"enabled": False}, "cache": {"enabled": False}}
        tiny = {"provider": "vllm", "model": realvllm.SERVED_NAME, "picker": "kv-events", "endpoints": endpoints}
        path = logs / "oculis-config.yaml"
        path.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "tok", "tokenizer": str(tiny_model), **tiny}, {"name": "text", **tiny}],
            "routes": [{"name": "via-tok", "tiers": [{"name": "only", "upstream": "tok"}], **plain},
                       {"name": "via-text", "tiers": [{"name": "only", "upstream": "text"}], **plain}]}}))
        app = build_app(config_path=path, reload_interval=0.5, backoff=0.001)
        with Server(app) as server:
            yield Pair(started, events, server.url, app)
        realvllm.STATS["kv-events-real"] = (f"two engines with KV events (16 MiB KV each) answered /health "
                                   f"{max(e.started_s for e in started):.0f}s after start")


def _prompt(tag: str, g: int) -> str:
    # ~330 tiny-model tokens: two whole 128-token blocks shared by a group, under max_model_len 512
    return f"[{tag} group {g}] " + " ".join(f"def {tag}{g}_f{i}(x): return x * {i}" for i in range(20))


def _body(tag: str, g: int, n: int) -> dict[str, Any]:
    return {"max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": _prompt(tag, g)},
                         {"role": "user", "content": f"question {n} of {tag}{g}: what does f{n} return?"}]}


def _shared_blocks(mt: model_tokens.ModelTokens, a: dict[str, Any], b: dict[str, Any]) -> int:
    ia, ib = mt.chat_ids(a), mt.chat_ids(b)
    assert ia is not None and ib is not None
    common = next((i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y), min(len(ia), len(ib)))
    return common // BLOCK


def _both_heard(pair: Pair) -> None:
    """Each engine has published to the router (a warm-up prompt of its own, sent to it directly), so
    neither is scored from the router's own memory (`fallback`); ZMQ drops what a subscriber missed
    while connecting, so the warm-up is repeated until heard."""
    for n in range(20):
        pools = [pair.pool("tok"), pair.pool("text")]
        quiet = [r for r in pair.replica_of if not all(p.picker.index.heard(r) for p in pools)]
        if not quiet:
            return
        for rid in quiet:
            body = {"model": realvllm.SERVED_NAME, "max_tokens": 1,
                    "messages": [{"role": "user", "content": _prompt(f"warm{n}", 0)}]}
            assert httpx.post(rid + "/chat/completions", json=body, timeout=180).status_code == 200
        time.sleep(2)
    pytest.fail("the router heard no KV events from an engine after 20 warm-ups")


def test_the_router_tokenizes_a_chat_exactly_as_the_engine_does(pair: Pair, tiny_model: Path) -> None:
    mt = model_tokens.load(str(tiny_model))
    engine = pair.engines[0]
    bodies = [_body("ids", 0, 1),
              {"messages": [{"role": "user", "content": [{"type": "text", "text": "two"},
                                                         {"type": "text", "text": "parts ünï"}]},
                            {"role": "assistant", "content": "ok"}, {"role": "user", "content": "<|im_end|> x"}]},
              {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u", "name": "ann"},
                            {"role": "developer", "content": "d"}], "add_generation_prompt": False}]
    for body in bodies:
        r = httpx.post(engine.url + "/tokenize", json={"model": realvllm.SERVED_NAME, **body}, timeout=60)
        assert r.status_code == 200, r.text
        assert mt.chat_ids(body) == r.json()["tokens"]
    r = httpx.post(engine.url + "/tokenize", json={"model": realvllm.SERVED_NAME, "prompt": "def main():"}, timeout=60)
    assert mt.completion_ids({"prompt": "def main():"}) == r.json()["tokens"]
    # What the router pays per chat to tokenize it itself vs asking the engine (printed, not asserted).
    body = _body("cost", 0, 0)
    local, remote = [], []
    for _ in range(30):
        t0 = time.perf_counter()
        pick_request(body, "chat", BLOCK, True, tokens=mt)
        local.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        httpx.post(engine.url + "/tokenize", json={"model": realvllm.SERVED_NAME, **body}, timeout=60)
        remote.append(time.perf_counter() - t0)
    size = len(mt.chat_ids(body) or [])
    realvllm.STATS["tokenize-cost"] = (f"a {size}-token chat: router-side template+tokenize+hash "
                              f"median {statistics.median(local) * 1e3:.2f} ms, engine /tokenize round trip "
                              f"median {statistics.median(remote) * 1e3:.2f} ms (idle engine)")


def _place_group(pair: Pair, upstream: str, g: int, mt: model_tokens.ModelTokens) -> tuple[dict[str, Any], str]:
    """The group's first request through `upstream`, and the engine it went to, once that engine's KV events
    have told the router (the upstream's own index) that it stored the group's shared blocks."""
    first = _body(upstream, g, 0)
    holder = pair.chat(upstream, first).headers["x-oculis-replica"]
    req = pick_request(first, "chat", BLOCK, True, tokens=mt)
    shared = _shared_blocks(mt, first, _body(upstream, g, 1))
    assert shared >= 2, "the test's prompts must share at least two whole blocks"
    index = pair.pool(upstream).picker.index
    # the router learns the blocks from the engine's events, not from having sent them there
    eventually(lambda: index.match(req.block_hashes, [holder])[holder] >= shared, timeout=30,
               what=f"group {g}'s blocks in the {upstream} index for {holder}")
    return first, holder


def test_shared_prefixes_land_on_the_engine_holding_their_blocks(pair: Pair, tiny_model: Path) -> None:
    mt = model_tokens.load(str(tiny_model))
    _both_heard(pair)
    before = {rid: _hits(e) for rid, e in pair.replica_of.items()}
    cached_at = dict.fromkeys(pair.replica_of, 0)
    prefix_picks = pair.picks("tok", "prefix")
    for g in range(GROUPS):
        first, holder = _place_group(pair, "tok", g, mt)
        for n in range(1, FOLLOW_UPS + 1):
            body = _body("tok", g, n)
            r = pair.chat("tok", body)
            assert r.headers["x-oculis-replica"] == holder, f"group {g} follow-up {n} left its blocks' engine"
            cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached == _shared_blocks(mt, first, body) * BLOCK  # the engine found the whole shared prefix
            cached_at[holder] += cached
    assert pair.picks("tok", "prefix") - prefix_picks == GROUPS * FOLLOW_UPS
    # The engines' own prefix-cache counters: each grew by exactly what the follow-ups it served reused.
    assert {rid: _hits(e) - before[rid] for rid, e in pair.replica_of.items()} == cached_at
    total = GROUPS * FOLLOW_UPS
    realvllm.STATS["kv-events-tok"] = (f"with tokenizer: {total}/{total} follow-ups on their "
                              f"prefix's engine, engines' prefix-cache hits {sum(cached_at.values())} tokens "
                              f"({', '.join(f'{v}' for v in cached_at.values())} per engine)")


def test_without_a_tokenizer_text_keys_never_match_a_real_engines_events(pair: Pair, tiny_model: Path) -> None:
    mt = model_tokens.load(str(tiny_model))
    _both_heard(pair)
    landed = 0
    for g in range(GROUPS):
        _, holder = _place_group(pair, "text", g, mt)
        for n in range(1, FOLLOW_UPS + 1):
            landed += pair.chat("text", _body("text", g, n)).headers["x-oculis-replica"] == holder
    assert pair.picks("text", "prefix") == 0 and pair.picks("text", "fallback") == 0
    realvllm.STATS["kv-events-text"] = (f"without tokenizer (text hashing): no pick matched the engines' events; "
                               f"{landed}/{GROUPS * FOLLOW_UPS} follow-ups on their prefix's engine by load alone")
