"""A replica's own 503 or 429 with a long Retry-After says that replica is busy, not its upstream (QA3 Part 2
#1): the real router in front of three fake replicas of one upstream (one answers 503 + Retry-After 30, one
429 + Retry-After 30, one answers) serves every request from the healthy one, and sets each refusing replica
aside for the 30 s its engine asked (not the router's 5 s), so neither sees a second call. With no other
replica, the refusal still goes to the client with its Retry-After, as before."""

from __future__ import annotations

from pathlib import Path

import httpx
import yaml
from fake_upstreams import Script, Server, openai_app
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router


def _ask(url: str, n: int) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=30, json={
        "model": "chat", "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {n}"}]})


def test_a_busy_replica_s_refusal_is_retried_on_a_free_replica_and_set_aside_as_long_as_asked(
        tmp_path: Path) -> None:
    busy = Script(fail_times=1000, fail_status=503, fail_headers={"retry-after": "30"})
    limited = Script(fail_times=1000, fail_status=429, fail_headers={"retry-after": "30"})
    good = Script()
    with Server(openai_app("busy", busy)) as b, Server(openai_app("limited", limited)) as lim, \
            Server(openai_app("good", good)) as g:
        cfg = tmp_path / "busy.yaml"
        cfg.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "llama", "provider": "vllm", "model": "m", "picker": "round-robin",
                           "endpoints": [g.url + "/v1", b.url + "/v1", lim.url + "/v1"]}],
            "routes": [{"name": "chat", "tiers": [{"name": "base", "upstream": "llama"}]}]}}))
        proc, url, mport = start_router(cfg, tmp_path / "busy.log")
        try:
            for n in range(8):
                r = _ask(url, n)
                assert r.status_code == 200, r.text
                assert r.headers["x-oculis-replica"] == g.url + "/v1"
            metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    # set aside for the Retry-After's 30 s: one call each, however long the eight requests took
    assert len(busy.received) == 1 and len(limited.received) == 1
    failed = {s.labels["replica"]: s.value for f in text_string_to_metric_families(metrics) for s in f.samples
              if s.name == "oculis_replica_failures_total"}
    assert failed == {b.url + "/v1": 1, lim.url + "/v1": 1}


def test_the_only_replica_s_refusal_still_reaches_the_client_with_its_retry_after(tmp_path: Path) -> None:
    busy = Script(fail_times=1000, fail_status=503, fail_headers={"retry-after": "30"})
    with Server(openai_app("busy", busy)) as b:
        cfg = tmp_path / "one.yaml"
        cfg.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "llama", "provider": "vllm", "model": "m", "endpoints": [b.url + "/v1"]}],
            "routes": [{"name": "chat", "tiers": [{"name": "base", "upstream": "llama"}]}]}}))
        proc, url, _ = start_router(cfg, tmp_path / "one.log")
        try:
            r = _ask(url, 0)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    assert r.status_code == 503 and r.headers["retry-after"] == "30", r.text
