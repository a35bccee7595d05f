"""The real router in front of four real `oculis sim serve` processes (one upstream, `endpoints:`
listing its four replicas), on shared-prefix traffic: the prefix strategies keep each prefix group on
the replica that holds it (`kv-events`: as the engines' own published KV events say), so the engines'
own prefix-cache counters (`vllm:prefix_cache_hits` /
`_queries`, the robust signal on a busy machine) show a higher hit share than `random`. TTFT p90 is
printed beside it, not asserted (timings on two busy cores are not evidence). Also: a replica that
refuses connections is set aside and the request served by another, never failed."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_support import eventually
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router
from sim_support import healthy, ports_from, stop_all, wait_healthy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
REPLICAS = 4
GROUPS = 8
PREFIX_WORDS = 450  # ~500 simulator tokens: ~31 blocks of 16
BLOCKS = 110  # KV blocks per replica: about three groups' prefixes, so a replica seeing all eight thrashes
REQUESTS = 96
CONCURRENCY = 6  # up to 6 x ~30 blocks in flight on one replica: past its 110, so it queues and preempts
PORT_BASE = 36100  # this suite's range (36000-36999)


EVENTS: dict[str, str] = {}  # sim URL -> its KV-event publisher


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    procs, urls = [], []
    ports = ports_from(PORT_BASE, 2 * REPLICAS)
    for port, zport in zip(ports[:REPLICAS], ports[REPLICAS:], strict=True):
        events = f"tcp://127.0.0.1:{zport}"
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
             "--num-gpu-blocks-override", str(BLOCKS), "--max-num-seqs", "16", "--max-model-len", "1024",
             "--host", "127.0.0.1", "--port", str(port), "--seed", str(port), "--kv-events-config",
             # a wildcard endpoint is bound (an address would be connected to, as vLLM does); the router connects
             f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{zport}"}}'],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}")
        EVENTS[urls[-1]] = events
    try:
        wait_healthy(urls)
        yield urls
    finally:
        stop_all(procs)


def _prefix_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
            for s in fam.samples:
                if s.name == "vllm:prefix_cache_hits_total":
                    hits += s.value
                elif s.name == "vllm:prefix_cache_queries_total":
                    queries += s.value
    return hits, queries


def _config(tmp: Path, name: str, endpoints: list[str], picker: str) -> Path:
    path = tmp / f"{name}.yaml"
    listed: list[object] = [{"url": u + "/v1", "kv_events": EVENTS[u]} if picker == "kv-events" else u + "/v1"
                            for u in endpoints]
    path.write_text(yaml.safe_dump({"oculis": {"upstreams": [
        {"name": "llama", "provider": "vllm", "model": MODEL, "picker": picker, "endpoints": listed}]}}))
    return path


def _traffic(router: str, tag: str) -> tuple[list[float], list[str]]:
    """Shared-prefix chat: each request draws one of GROUPS long system prompts and asks a short unique
    question, streamed; returns client TTFTs and the replica each was sent to."""
    rng = random.Random(tag)
    prefixes = [" ".join(f"{tag}{g}w{i}" for i in range(PREFIX_WORDS)) for g in range(GROUPS)]
    bodies = [{"model": "llama", "max_tokens": 4, "stream": True,
               "messages": [{"role": "system", "content": prefixes[rng.randrange(GROUPS)]},
                            {"role": "user", "content": f"question {n} {rng.random():.6f}"}]}
              for n in range(REQUESTS)]

    def one(body: dict[str, object]) -> tuple[float, str]:
        import time

        t0 = time.perf_counter()
        with httpx.stream("POST", router + "/v1/chat/completions", json=body, timeout=60) as resp:
            assert resp.status_code == 200, resp.read()
            ttft = None
            for line in resp.iter_lines():
                if ttft is None and line.startswith("data: "):
                    ttft = time.perf_counter() - t0
                assert "stream_interrupted" not in line
            return ttft or 0.0, resp.headers.get("x-oculis-replica", "")

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        out = list(pool.map(one, bodies))
    return [t for t, _ in out], [r for _, r in out]


def _heard_from_each(sims: list[str], mport: int) -> None:
    """Each simulator publishes a batch the new router hears (a prompt of its own, sent to it directly)
    before the traffic: a replica the router has not heard from yet is scored from its prefix memory
    (`fallback`), which at 6 concurrent requests its first shared-prefix picks would otherwise be."""
    for n, url in enumerate(sims):
        body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": f"warm {n} " * 40}]}
        assert httpx.post(url + "/v1/chat/completions", json=body, timeout=30).status_code == 200

    def applied() -> float:
        text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=5).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "oculis_kv_event_batches_total" and s.labels.get("outcome") == "applied")

    eventually(lambda: applied() >= len(sims), timeout=30, what="a KV-event batch from each simulator")


def _p90(xs: list[float]) -> float:
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def test_prefix_strategies_beat_random_on_the_engines_own_prefix_cache(sims: list[str], tmp_path: Path) -> None:
    share: dict[str, float] = {}
    p90: dict[str, float] = {}
    for picker in ("random", "prefix", "kv-events"):
        proc, url, mport = start_router(_config(tmp_path, picker, sims, picker), tmp_path / f"{picker}.log")
        try:
            if picker == "kv-events":
                _heard_from_each(sims, mport)
            h0, q0 = _prefix_counters(sims)
            ttfts, replicas = _traffic(url, picker.replace("-", ""))
            h1, q1 = _prefix_counters(sims)
            metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        share[picker] = (h1 - h0) / max(q1 - q0, 1.0)
        p90[picker] = _p90(ttfts)
        assert len(set(replicas)) > 1 and all(r.startswith("http://127.0.0.1:") for r in replicas)
        reasons = {s.labels["reason"] for f in text_string_to_metric_families(metrics) for s in f.samples
                   if s.name == "oculis_picks_total" and s.labels["strategy"] == picker}
        # kv-events: scored from the engines' own KV events (the simulators publish them)
        assert {"random": "random", "prefix": "prefix", "kv-events": "prefix"}[picker] in reasons
        assert picker != "kv-events" or "fallback" not in reasons
    print("\nengine prefix-cache hit share / client TTFT p90 (s), "
          f"{REPLICAS} replicas, {GROUPS} groups, {REQUESTS} requests:")
    for picker in share:
        print(f"  {picker:10s} {share[picker]:.3f}  {p90[picker]:.3f}")
    assert share["prefix"] > share["random"] + 0.15
    assert share["kv-events"] > share["random"] + 0.15


def test_a_replica_refusing_connections_is_set_aside_and_the_request_served_by_another(
        sims: list[str], tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{ports_from(PORT_BASE + 50, 1)[0]}"
    proc, url, mport = start_router(_config(tmp_path, "dead", [dead, *sims[:2]], "round-robin"),
                                    tmp_path / "dead.log")
    try:
        for n in range(9):
            r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
                "model": "llama", "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {n}"}]})
            assert r.status_code == 200, r.text
            assert r.headers["x-oculis-replica"] != dead + "/v1"
        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    failed = [s for f in text_string_to_metric_families(metrics) for s in f.samples
              if s.name == "oculis_replica_failures_total"]
    assert [s.labels["replica"] for s in failed] == [dead + "/v1"]
    assert failed[0].value == 1  # set aside after one failure: no further request went there


def test_a_replica_vanishing_mid_stream_ends_the_stream_with_an_error_event_not_a_hang(tmp_path: Path) -> None:
    port = ports_from(PORT_BASE + 60, 1)[0]
    sim = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
                            "--host", "127.0.0.1", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    proc = None
    try:
        eventually(lambda: healthy(url), timeout=60, what="sim /health")
        proc, router, _ = start_router(_config(tmp_path, "vanish", [url], "prefix"), tmp_path / "vanish.log")
        body = {"model": "llama", "max_tokens": 3000, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": "tell me a long story"}]}
        lines: list[str] = []
        with httpx.stream("POST", router + "/v1/chat/completions", json=body, timeout=30) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                lines.append(line)
                if len(lines) == 3:
                    sim.kill()  # the replica vanishes mid-stream
        assert any("stream_interrupted" in line for line in lines[-3:]), lines[-3:]
    finally:
        sim.kill()
        sim.wait(timeout=10)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)


def test_a_replica_answering_5xx_is_set_aside_and_the_tier_does_not_escalate(tmp_path: Path) -> None:
    from fake_upstreams import Script, Server, openai_app

    bad, good = Script(fail_times=1000, fail_status=500), Script()
    with Server(openai_app("bad", bad)) as b, Server(openai_app("good", good)) as g:
        cfg = tmp_path / "5xx.yaml"
        cfg.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "llama", "provider": "vllm", "model": "m", "picker": "round-robin",
                           "endpoints": [b.url + "/v1", g.url + "/v1"]},
                          {"name": "big", "provider": "vllm", "model": "m", "base_url": g.url + "/v1"}],
            "routes": [{"name": "chat", "strategy": "semantic", "tiers": [
                {"name": "small", "match": {}, "upstream": "llama"}, {"name": "large", "match": {}, "upstream": "big"}],
                "escalation": {"enabled": True, "max_retries": 0}}]}}))
        proc, url, _ = start_router(cfg, tmp_path / "5xx.log")
        try:
            for n in range(6):
                r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
                    "model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {n}"}]})
                assert r.status_code == 200, r.text
                # max_retries 0, yet the other replica of the same upstream answered: no escalation
                assert r.headers["x-oculis-upstream"] == "llama" and r.headers["x-oculis-replica"] == g.url + "/v1"
        finally:
            proc.terminate()
            proc.wait(timeout=10)
        assert len(bad.received) == 1  # set aside after its 500: no further call went there
