"""The operator's and the measurement commands' PromQL, read from real vLLM scraped by the real Prometheus.

The engine runs with a KV cache of a few blocks and four sequences (a burst really queues and preempts)
and ngram speculative decoding (real acceptance counters). Prometheus scrapes it with the labels an engine
pod's scrape carries (namespace, pod <name>-vllm-<rs>-<id>), so the operator's own query functions run
unchanged: the observed KV check (cache_config_info), the autoscaler's sample, the speculative guard's
window and the canary's queries."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import realvllm
import yaml
from e2e_support import eventually
from skips import needs_command

from oculis.upstream import ModelConfig
from oculis_operator import autoscale, canary, capacity, speculative
from oculis_operator.promquery import prometheus_kv_blocks, prometheus_result, prometheus_value

NS, NAME, POD = "realengine", "tiny", "tiny-vllm-5d8f9c7b4-x2x4q"
KV_BYTES = 1024 * 1024  # --kv-cache-memory-bytes 1M (an upper-case suffix is binary)
BLOCK = 128  # the CPU backend's block size

pytestmark = needs_command("prometheus", "prometheus")


class Scraped:
    def __init__(self, engine: realvllm.Engine, url: str) -> None:
        self.engine, self.url = engine, url

    def value(self, query: str) -> float | None:
        return prometheus_value(self.url, query)

    def query(self, q: str) -> list[dict[str, Any]] | None:
        return prometheus_result(self.url, q)


@pytest.fixture(scope="module")
def scraped(engines: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scraped]:
    engine = engines.get("pressure")
    tmp = tmp_path_factory.mktemp("prometheus")
    port = realvllm.free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "vllm", "static_configs": [
            {"targets": [engine.url.removeprefix("http://")], "labels": {"namespace": NS, "pod": POD}}]}]}))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    s = Scraped(engine, f"http://127.0.0.1:{port}")
    try:
        eventually(lambda: (s.value('count({__name__=~"vllm:.+"})') or 0) > 10, timeout=60,
                   what="Prometheus to scrape the engine")
        yield s
    finally:
        proc.terminate()
        proc.wait(10)


def burst(engine: realvllm.Engine, n: int, max_tokens: int = 250) -> None:
    """n concurrent greedy completions: a random model decoding greedily falls into loops, which ngram
    drafts then predict; four of them (~325 tokens, 3 blocks each) outgrow the 8-block cache and preempt."""
    prompt = "the cat sat on the mat. " * 12

    def one() -> None:
        httpx.post(engine.url + "/v1/completions", timeout=600, json={
            "model": realvllm.SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0})

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def tiny_config(model: Path) -> ModelConfig:
    cfg = yaml.safe_load((model / "config.json").read_text())
    return ModelConfig(params_billions=0.002, num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
                       num_attention_heads=cfg["num_attention_heads"], num_kv_heads=cfg["num_key_value_heads"],
                       head_dim=cfg["head_dim"], vocab_size=cfg["vocab_size"],
                       max_position_embeddings=cfg["max_position_embeddings"])


def test_observed_kv_blocks_match_the_operators_bytes_per_token(scraped: Scraped, tiny_model: Path) -> None:
    blocks = prometheus_kv_blocks(scraped.url, NS, NAME)
    per_token = capacity.kv_bytes_per_token(tiny_config(tiny_model), 1, "auto")
    assert blocks == KV_BYTES // (per_token * BLOCK), (blocks, per_token)
    labels = (scraped.query(f'vllm:cache_config_info{{namespace="{NS}"}}') or [{}])[0].get("metric", {})
    assert labels.get("block_size") == str(BLOCK) and labels.get("enable_prefix_caching") == "True", labels


def test_a_burst_gives_the_autoscaler_a_real_queue_and_the_canary_real_preemptions(scraped: Scraped) -> None:
    seen: list[autoscale.Sample] = []
    t = threading.Thread(target=burst, args=(scraped.engine, 16))
    t.start()
    try:
        def queued() -> bool:
            s = autoscale.sample_from(scraped.query, NS, NAME)
            if s is not None:
                seen.append(s)
            return s is not None and s.waiting > 0 and s.running > 0
        eventually(queued, timeout=120, what="a sample with requests waiting behind running ones")
    finally:
        t.join()
    busiest = max(seen, key=lambda s: s.waiting)
    assert busiest.pods == 1 and busiest.running <= 4 and 0 < busiest.kv_usage <= 1
    policy = autoscale.Policy(min_replicas=1, max_replicas=4, waiting_per_replica=2)
    assert autoscale.recommend(policy, busiest, None) >= 2, busiest
    # The canary's queries over the same window, from the same scrape.
    eventually(lambda: (scraped.value(canary.queries(NS, NAME, "stable", 120)["requests"]) or 0) >= 16, timeout=30,
               what="the burst's finished requests in Prometheus")
    sample = canary.sample({k: scraped.value(q) for k, q in canary.queries(NS, NAME, "stable", 120).items()})
    assert sample is not None and sample.ttft_p95_ms and sample.e2e_p95_ms and sample.itl_p95_ms, sample
    assert sample.preemptions_per_minute is not None and sample.preemptions_per_minute > 0, sample
    assert sample.error_rate == 0, sample


def test_ngram_drafts_give_the_speculative_guard_real_acceptance(scraped: Scraped) -> None:
    burst(scraped.engine, 4)
    qs = speculative.queries(NS, NAME, 300)

    def counted() -> bool:
        return (scraped.value(qs["draft_tokens"]) or 0) >= speculative.MIN_DRAFT_TOKENS
    eventually(counted, timeout=30, what="draft tokens in Prometheus")
    sample = speculative.Sample(**{k: scraped.value(q) for k, q in qs.items()})
    assert sample.draft_tokens and sample.accepted_tokens is not None and sample.drafts
    rate, length = speculative.rates(sample)
    assert rate is not None and 0 <= rate <= 1 and length is not None and length >= 1
    verdict = speculative.decide(0.5, True, sample, 300, None, "2026-12-01T00:00:00Z")
    assert verdict.decision in ("Keep", "Watching"), verdict


def test_cache_advise_reads_the_engines_real_prefix_cache_hits(scraped: Scraped) -> None:
    from oculis_cli.cache_advise import _self_hosted
    from oculis_measure.prom import Prometheus

    start = time.time() - 5
    prompt = " ".join(f"rule {i}: answer briefly." for i in range(35))  # two 128-token blocks and more
    for _ in range(2):
        r = httpx.post(scraped.engine.url + "/v1/completions", timeout=120,
                       json={"model": realvllm.SERVED_NAME, "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200, r.text

    def advice() -> dict[str, Any] | None:
        out = _self_hosted(Prometheus(scraped.url), realvllm.SERVED_NAME, None, start, time.time())
        return out if out.get("prefix_hit_tokens", 0) >= BLOCK else None

    assert eventually(advice, timeout=30, what="`oculis cache advise` to see the hits")["verdict"] == "pays"
