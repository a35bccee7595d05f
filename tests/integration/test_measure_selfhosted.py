"""`oculis cache advise` on a self-hosted upstream: the engines' own prefix-cache token counters
(a real `oculis sim serve` behind a real `oculis serve`, both scraped by a real Prometheus)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import free_port
from router_support import start_prometheus
from skips import needs_command
from test_router_processes import start_router

from oculis_cli.main import main
from oculis_measure.prom import Prometheus

pytestmark = needs_command("prometheus", "prometheus")
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PREFIX = "You are a careful assistant for the Oculis project. " * 30  # the same system prompt every time


def test_cache_advise_reads_a_self_hosted_engines_prefix_cache(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    sport = free_port()
    sim = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--served-model-name",
                            "llama-sim", "--max-model-len=4096", "--enable-prefix-caching", "--gpu",
                            "NVIDIA-H100-80GB-HBM3", "--host", "127.0.0.1", "--port", str(sport)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           cwd=Path(__file__).resolve().parents[2])
    procs: list[subprocess.Popen[bytes]] = [sim]
    try:
        eventually(lambda: httpx.get(f"http://127.0.0.1:{sport}/health", timeout=1).status_code == 200, timeout=30,
                   what="oculis sim serve answers /health")
        cfg = tmp_path / "oculis-config.yaml"
        cfg.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "llama-sim", "provider": "vllm", "base_url": f"http://127.0.0.1:{sport}/v1",
                           "model": "llama-sim", "pricing": {"input_per_mtok": 0.05, "output_per_mtok": 0.08}}],
            "routes": [{"name": "chat", "tiers": [{"name": "only", "upstream": "llama-sim"}]}]}}))
        router, url, mport = start_router(cfg, tmp_path / "router.log")
        procs.append(router)
        prom, purl = start_prometheus(tmp_path, {"oculis": [f"127.0.0.1:{mport}"], "engines": [f"127.0.0.1:{sport}"]})
        procs.append(prom)
        with httpx.Client(timeout=60) as client:
            for i in range(6):
                r = client.post(url + "/v1/chat/completions", json={
                    "model": "chat", "max_tokens": 8, "temperature": 0.7,
                    "messages": [{"role": "system", "content": PREFIX}, {"role": "user", "content": f"question {i}"}]})
                assert r.status_code == 200, r.text
        with Prometheus(purl) as p:
            eventually(lambda: p.wait_scraped(time.time(), timeout=5), timeout=30, what="Prometheus scrapes both")
        code = main(["cache", "advise", "--upstream", "llama-sim", "--since", "10m", "--config", str(cfg),
                     "--prometheus-url", purl, "-o", "json"])
        captured = capsys.readouterr()
        assert captured.out.strip(), captured.err
        rep = json.loads(captured.out)
        assert code == 0 and rep["min_hits"] == 1 and rep["break_even_hits"] == 0, rep
        # five of six requests reuse the long system prompt's blocks
        assert rep["prefix_hit_token_share"] is not None and 0.5 < rep["prefix_hit_token_share"] < 1, rep
        assert rep["verdict"] == "pays", rep
        # QA3 Part 2 #6: one multiplier given switched the data to the router's (empty) cached-token counter and
        # the other multiplier to the pricing's r 1: "0.0%, no-reuse" or "does-not-pay" for the same window.
        for flag, value in (("--read-multiplier", "0.1"), ("--write-multiplier", "1.25")):
            code = main(["cache", "advise", "--upstream", "llama-sim", "--since", "10m", "--config", str(cfg),
                         "--prometheus-url", purl, "-o", "json", flag, value])
            flagged = json.loads(capsys.readouterr().out)
            assert code == 0 and flagged["prefix_hit_token_share"] == rep["prefix_hit_token_share"], flagged
            assert flagged["verdict"] == "pays" and flag in flagged["multipliers_from"], flagged
        # The engine goes (scaled to zero, or its pod replaced): its traffic still counts for the window.
        sim.terminate()
        sim.wait(10)
        time.sleep(3)  # a few scrapes fail, so Prometheus marks the engine's series stale
        code = main(["cache", "advise", "--upstream", "llama-sim", "--since", "10m", "--config", str(cfg),
                     "--prometheus-url", purl, "-o", "json"])
        after = json.loads(capsys.readouterr().out)
        assert code == 0 and after["prefix_hit_token_share"] == rep["prefix_hit_token_share"], after
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(10)
