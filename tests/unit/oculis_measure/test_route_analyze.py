"""`oculis route analyze`: a traffic sample's tier split and thresholds for a wanted split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oculis import load_config
from oculis_measure.route.analysis import Scored, analyze, parse_shares

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
ROUTE = load_config(SEED).route("adaptive")  # tiers simple / standard / complex


def test_shares_and_suggested_thresholds_split_the_sample_as_asked() -> None:
    scored = [Scored(i / 100, 0.9, "simple", False) for i in range(100)]
    report = analyze(ROUTE, scored, [0.5, 0.3, 0.2])
    assert report["prompts"] == 100 and report["tiers"][0]["share"] == 1.0
    cut = report["suggested_complexity_below"]
    assert list(cut) == ["simple", "standard"]  # the last tier catches the rest
    assert sum(s.complexity < cut["simple"] for s in scored) == 50
    assert sum(cut["simple"] <= s.complexity < cut["standard"] for s in scored) == 30
    assert report["low_confidence_share"] == 0.0


def test_an_empty_tier_still_gets_a_valid_threshold() -> None:
    scored = [Scored(0.0, 0.9, "simple", False)] * 10
    cut = analyze(ROUTE, scored, [0.0, 0.5, 0.5])["suggested_complexity_below"]
    assert 0 < cut["simple"] <= 1 and 0 < cut["standard"] <= 1


@pytest.mark.parametrize(("raw", "says"), [("0.5,0.5", "2 shares given for a route of 3 tiers"),
                                           ("0.5,x,0.2", "not a comma-separated list"),
                                           ("0.6,0.3,0.3", "sum to 1")])
def test_bad_shares_name_the_problem(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_shares(raw, 3)


def test_cli_reports_and_skips_bad_lines() -> None:
    sample = "\n".join([json.dumps({"prompt": "hi"}), "not json", json.dumps({"messages": [
        {"role": "user", "content": "What is the area of a triangle with vertices (0,0), (4,0), (0,3)?"}]})]) + "\n"
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "route", "analyze", "--config", str(SEED),
                           "--route", "adaptive", "--shares", "0.5,0.3,0.2", "-o", "json"],
                          input=sample, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "skipped line 2" in proc.stderr and "Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["prompts"] == 2 and set(report["suggested_complexity_below"]) == {"simple", "standard"}
    bad = subprocess.run([sys.executable, "-m", "oculis_cli.main", "route", "analyze", "--config", str(SEED),
                          "--route", "adaptive", "--shares", "1"], input="", capture_output=True, text=True)
    assert bad.returncode == 2 and "--shares: 1 shares given" in bad.stderr
