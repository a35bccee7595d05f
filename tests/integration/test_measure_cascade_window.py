"""`oculis route analyze --since` measures the answer-escalation rate for the cascade cost from a real
Prometheus scraping a real `oculis serve` whose cheap tier was unsure of some of its answers, or whose
verifier graded some of them below the bar."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from router_support import Fakes, start_prometheus, start_router
from skips import needs_command

from oculis_cli.main import main
from oculis_measure.prom import Prometheus

pytestmark = needs_command("prometheus", "prometheus")

EASY = ["hi", "thanks!", "say hello", "ok"]  # the 8B tier's (simple) prompts


@contextlib.contextmanager
def serving(fakes: Fakes, tmp_path: Path, on_answer: dict[str, Any]) -> Iterator[tuple[Path, str, str]]:
    """A router with the route's escalation.on_answer and a Prometheus scraping it: (config, url, prom url)."""
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump(fakes.config(
        escalation={"enabled": True, "on_low_confidence": False, "on_answer": on_answer}, cache={"enabled": False})))
    router, url, mport = start_router(cfg, tmp_path / "router.log")
    prom, purl = start_prometheus(tmp_path, {"oculis": [f"127.0.0.1:{mport}"]})
    try:
        yield cfg, url, purl
    finally:
        prom.terminate()
        router.terminate()
        prom.wait(10)
        router.wait(10)


def ask_easy(client: httpx.Client, url: str) -> list[httpx.Response]:
    out = []
    for prompt in EASY:
        r = client.post(url + "/v1/chat/completions", json={
            "model": "adaptive", "messages": [{"role": "user", "content": prompt}]})
        assert r.status_code == 200, r.text
        out.append(r)
    return out


def analyze_window(cfg: Path, purl: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    with Prometheus(purl) as p:
        # Prometheus up (a PromError until then), and a scrape of every target after the last request
        eventually(lambda: p.wait_scraped(time.time(), timeout=10), timeout=30, what="a scrape after")
    argv = ["route", "analyze", "--route", "adaptive", "--since", "15m", "--config", str(cfg), "--prometheus-url", purl]
    assert main([*argv, "-o", "json"]) == 0
    casc: dict[str, Any] = json.loads(capsys.readouterr().out)["cascade"]
    assert main(argv) == 0
    assert "p_esc: the window" in capsys.readouterr().out
    return casc


def test_the_windows_answer_escalation_rate_is_the_routers_replaced_answers_over_the_answers_checked(
        fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("small", "large"):
        fakes.scripts[name].give_logprobs = True
    fakes.scripts["large"].logprob = -0.2
    with serving(fakes, tmp_path, {"min_mean_logprob": -1.0}) as (cfg, url, purl):
        replaced = kept = 0
        with httpx.Client(timeout=30, headers={"authorization": "Bearer sk-client"}) as client:
            for logprob in (-2.5, -0.5):  # unsure of every answer, then sure of every one
                fakes.scripts["small"].logprob = logprob
                for r in ask_easy(client, url):
                    if r.headers.get("x-oculis-escalation-reason") == "answer":
                        replaced += 1
                    else:
                        assert r.headers["x-oculis-tier"] == "simple", r.headers
                        kept += 1
        assert (replaced, kept) == (len(EASY), len(EASY))
        casc = analyze_window(cfg, purl, capsys)
        # Per tier (attribution_routed_vs_final): the 8B produced 8 answers, 4 replaced; the 70B's 4 all kept.
        assert casc["tiers"][0]["p_esc"] == pytest.approx(round(replaced / (replaced + kept), 4))
        assert casc["tiers"][1]["p_esc"] == 0.0 and casc["tiers"][0]["routed_share"] == 1.0
        assert casc["p_esc_source"].startswith("the window")
        assert casc["total"]["cascade_cost"] > casc["total"]["routed_only_cost"] > 0
        assert casc["verifier"]["dollars"] == 0.0  # the logprob check makes no extra call


def test_the_windows_rate_counts_the_answers_the_verifier_replaced_and_the_cascade_pays_its_gradings(
        fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("small", "large"):
        fakes.scripts[name].give_logprobs = True
    fakes.scripts["large"].logprob = -0.2
    on_answer = {"min_mean_logprob": -1.0, "verifier": {"upstream": "claude", "min_score": 7}}
    with serving(fakes, tmp_path, on_answer) as (cfg, url, purl):
        tiers = []
        with httpx.Client(timeout=30, headers={"authorization": "Bearer sk-client"}) as client:
            # The 8B tier unsure of every answer (replaced by the logprob check, not graded), the 70B's graded 9: kept.
            fakes.scripts["small"].logprob, fakes.scripts["claude"].anthropic_text = -2.5, "Score: 9"
            tiers += [r.headers["x-oculis-tier"] for r in ask_easy(client, url)]
            # The 8B tier sure, but every answer graded 2: the 8B's and then the 70B's replaced, gpt-4o answers.
            fakes.scripts["small"].logprob, fakes.scripts["claude"].anthropic_text = -0.5, "Score: 2"
            tiers += [r.headers["x-oculis-tier"] for r in ask_easy(client, url)]
        assert tiers == ["standard"] * len(EASY) + ["complex"] * len(EASY)
        assert len(fakes.scripts["claude"].received) == 3 * len(EASY)  # 70B, then 8B and 70B, per prompt
        casc = analyze_window(cfg, purl, capsys)
        # Per tier: the 8B's 8 answers all replaced (4 by the logprobs, 4 by the grades); the 70B's 8: 4 replaced.
        assert casc["tiers"][0]["p_esc"] == 1.0 and casc["tiers"][1]["p_esc"] == 0.5
        assert "simple 8/8" in casc["p_esc_source"] and "standard 4/8" in casc["p_esc_source"]
        assert casc["tiers"][0]["routed_share"] == 1.0 and casc["tiers"][2]["final_share"] == 0.5
        assert casc["verifier"]["graders"] == {"claude": ["simple", "standard"]} and casc["verifier"]["dollars"] > 0
        assert casc["unchecked"] == {}  # gpt-4o is the last tier; both below it are graded
