"""`oculis route analyze --since` measures the answer-escalation rate for the cascade cost from a real
Prometheus scraping a real `oculis serve` whose cheap tier was unsure of some of its answers."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_support import eventually
from router_support import Fakes, start_prometheus
from test_router_processes import start_router

from oculis_cli.main import main
from oculis_cli.prom import Prometheus

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")

EASY = ["hi", "thanks!", "say hello", "ok"]  # the 8B tier's (simple) prompts


def test_the_windows_answer_escalation_rate_is_the_routers_replaced_answers_over_the_answers_checked(
        fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("small", "large"):
        fakes.scripts[name].give_logprobs = True
    fakes.scripts["large"].logprob = -0.2
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump(fakes.config(
        escalation={"enabled": True, "on_low_confidence": False, "on_answer": {"min_mean_logprob": -1.0}},
        cache={"enabled": False})))
    router, url, mport = start_router(cfg, tmp_path / "router.log")
    prom, purl = start_prometheus(tmp_path, {"oculis": [f"127.0.0.1:{mport}"]})
    try:
        replaced = kept = 0
        with httpx.Client(timeout=30, headers={"authorization": "Bearer sk-client"}) as client:
            for logprob in (-2.5, -0.5):  # unsure of every answer, then sure of every one
                fakes.scripts["small"].logprob = logprob
                for prompt in EASY:
                    r = client.post(url + "/v1/chat/completions", json={
                        "model": "adaptive", "messages": [{"role": "user", "content": prompt}]})
                    assert r.status_code == 200, r.text
                    if r.headers.get("x-oculis-escalation-reason") == "answer":
                        replaced += 1
                    else:
                        assert r.headers["x-oculis-tier"] == "simple", r.headers
                        kept += 1
        assert (replaced, kept) == (len(EASY), len(EASY))
        with Prometheus(purl) as p:
            # Prometheus up (a PromError until then), and a scrape of every target after the last request
            eventually(lambda: p.wait_scraped(time.time(), timeout=10), timeout=30, what="a scrape after")
        argv = ["route", "analyze", "--route", "adaptive", "--since", "15m", "--config", str(cfg),
                "--prometheus-url", purl]
        assert main([*argv, "-o", "json"]) == 0
        casc = json.loads(capsys.readouterr().out)["cascade"]
        # Answers the checked tiers gave: 4 replaced (8B) + 4 kept on 70B after them + 4 kept on 8B.
        assert casc["tiers"][0]["p_esc"] == pytest.approx(round(replaced / (2 * replaced + kept), 4))
        assert casc["p_esc_source"].startswith("the window")
        assert casc["total"]["cascade_cost"] > casc["total"]["routed_only_cost"] > 0
        assert main(argv) == 0
        assert "p_esc: the window" in capsys.readouterr().out
    finally:
        prom.terminate()
        router.terminate()
        prom.wait(10)
        router.wait(10)
