"""No impossible figure anywhere (issue 31, QA3 finding 3): every command run on an empty or degenerate input
prints a latency of no completed request, a rate over an empty window, a percentile of no samples or a share
over zero requests as absent (`-` in text, `null` in JSON with its reason under "absent"), never as 0.0, NaN
or a division by zero. One helper decides (oculis_measure.figures); these run each command through it."""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from oculis import parse_config
from oculis_cli import cost, route_window
from oculis_cli.clusterinputs import WindowInputs
from oculis_cli.cost_sources import Catalog
from oculis_cli.main import main
from oculis_measure import figures
from oculis_measure.bench.stats import RequestResult, fmt, summarize
from oculis_measure.cost.core import Counters

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "examples" / "oculis-config.yaml"
SIM = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"]
# QA3 finding 3: every prompt longer than max_model_len (nothing completes), and a stage of rate 0 (nothing sent)
WORKLOADS = {"all_refused": "prompt_tokens: 200000\noutput_tokens: 100\nstages: [{rate: 10, seconds: 2}]\n",
             "nothing_sent": "prompt_tokens: 200\noutput_tokens: 100\nstages: [{rate: 0, seconds: 2}]\n"}


def impossible(doc: Any, path: str = "") -> list[str]:
    """Where a JSON document holds an impossible figure: a NaN or infinity anywhere, a latency (a key in
    milliseconds) of exactly 0."""
    found: list[str] = []
    if isinstance(doc, dict):
        for k, v in doc.items():
            found += impossible(v, f"{path}.{k}")
            if "_ms" in f"{path}.{k}" and isinstance(v, int | float) and not isinstance(v, bool) and v == 0:
                found.append(f"{path}.{k} = 0 ms")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            found += impossible(v, f"{path}[{i}]")
    elif isinstance(doc, float) and not math.isfinite(doc):
        found.append(f"{path} = {doc}")
    return found


def no_number_words(text: str) -> None:
    assert not re.search(r"\b(nan|inf|NaN|Infinity)\b", text), text
    assert "Traceback" not in text and "ZeroDivisionError" not in text


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_sim_fleet_and_replay_print_no_latency_of_no_completed_request(
        workload: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "wl.yaml"
    wl.write_text(WORKLOADS[workload])
    assert main(["sim", "fleet", *SIM, "--replicas", "2", "--workload", str(wl)]) == 0
    text = capsys.readouterr().out
    row = next(line for line in text.splitlines() if line.startswith("prefix"))
    assert row.split()[1:9] == ["-"] * 8, row  # TTFT p50/p90/p99, ITL, E2E, tok/s, prefix hit, spread
    assert "  -: no request completed" in text
    no_number_words(text)
    assert main(["sim", "fleet", *SIM, "--replicas", "2", "--workload", str(wl), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert impossible(doc) == []
    assert doc["ttft_ms"] is None and doc["e2e_ms"] is None and doc["load_spread"] is None
    assert doc["output_tokens_per_s"] is None and doc["absent"]["ttft_ms"] == "no request completed"
    assert (doc["refused"] > 0) == (workload == "all_refused")  # the JSON says why nothing completed
    assert main(["sim", "replay", *SIM, "--workload", str(wl), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert impossible(doc) == [] and doc["requests_per_s"] is None and doc["prefix_cache_hit_rate"] is None
    assert set(doc["absent"]) >= {"ttft_ms", "e2e_ms", "output_tokens_per_s", "requests_per_s"}


def empty_window(route: bool) -> WindowInputs:
    cfg = parse_config(CONFIG.read_text(), str(CONFIG))
    return WindowInputs(datetime(2026, 12, 2, 3, 0, tzinfo=UTC), datetime(2026, 12, 2, 3, 10, tzinfo=UTC),
                        Catalog(cfg, source=str(CONFIG)), Counters(),
                        next(r for r in cfg.routes if r.name == "adaptive") if route else None)


@pytest.mark.parametrize("output", ["table", "json"])
def test_cost_report_and_route_analyze_of_an_empty_window_print_no_share_of_zero_requests(
        output: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # the window's counters as Prometheus would give them for a window without traffic
    monkeypatch.setattr(cost, "window_inputs", lambda args, name: empty_window(False))
    monkeypatch.setattr(route_window, "window_inputs", lambda args, name, route=False: empty_window(True))
    assert main(["cost", "report", "--config", str(CONFIG), "--since", "10m", "-o", output]) == 0
    cost_out = capsys.readouterr().out
    assert main(["route", "analyze", "--config", str(CONFIG), "--route", "adaptive", "--since", "10m",
                 "-o", output]) == 0
    route_out = capsys.readouterr().out
    for text in (cost_out, route_out):
        no_number_words(text)
    if output == "json":
        rep = json.loads(route_out)
        assert impossible(json.loads(cost_out)) == [] and impossible(rep) == []
        assert [t["share"] for t in rep["tiers"]] == [None] * 3
        assert [t["routed_share"] for t in rep["cascade"]["tiers"]] == [None] * 3
        assert rep["escalation"]["rate"] is None and rep["absent"]["tiers[0].share"] == "no request in the window"
    else:
        first = route_out.split("cascade")[0]  # the tier table (the cascade's p_esc 0.0% is configured, not a share)
        rows = [line.split() for line in first.splitlines() if line.startswith(("simple", "standard", "complex"))]
        assert rows and all(r[3] == "-" for r in rows), rows  # the share column: no 0.0% of no request
        assert "0.0%" not in first


def test_eval_run_prints_no_escalation_rate_of_no_escalatable_request(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "one.jsonl"  # one item, answered by the strongest tier: nothing could escalate
    suite.write_text((ROOT / "demo" / "eval-suite.jsonl").read_text().splitlines()[0] + "\n")
    argv = ["eval", "run", "--config", str(ROOT / "demo" / "eval-config.yaml"), "--route", "mmlu", "--suite",
            str(suite)]
    assert main(argv) == 4  # one item: INCONCLUSIVE
    text = capsys.readouterr().out
    no_number_words(text)
    cheap = next(line for line in text.splitlines() if line.startswith("cheap "))
    assert "0.0%" not in cheap  # no item started there: its escalated share does not exist
    assert main([*argv, "-o", "json"]) == 4
    doc = json.loads(capsys.readouterr().out)
    assert impossible(doc) == []
    assert doc["overall"]["escalation_rate"] is None and doc["tiers"][0]["escalated"] is None
    assert doc["absent"]["overall.escalation_rate"] == "no request started below the strongest tier"
    assert doc["cascade"]["tiers"][0]["p_esc"] is None


def test_bench_figures_of_a_run_where_nothing_ended_are_absent_with_their_reason() -> None:
    cut = [RequestResult(i, 1.0 + i, cancelled=True, ended_s=20.0) for i in range(5)]
    for results in ([], cut):
        m = summarize(results, 10.0)
        doc = figures.with_reasons({"current": m})
        assert impossible(doc) == []
        assert doc["current"]["error_rate"] is None  # no request ended: no error rate, never 0 %
        assert doc["current"]["tpot_ms"] is None and "current.tpot_ms" in doc["absent"]
        assert fmt(m["error_rate"], 3) == "-"
    m = summarize([], 10.0)
    assert m["ttft_ms"] == figures.absent("no measured request succeeded") and m["goodput_share"] == figures.absent(
        "no request was measured")


@pytest.mark.parametrize(("value", "shown"), [
    (figures.absent("x"), "-"), (None, "-"), (float("nan"), "-"), (float("inf"), "-"), (0.0, "0.0"), (2.5, "2.5")])
def test_one_helper_prints_every_figure_that_cannot_exist_as_a_dash(value: Any, shown: str) -> None:
    assert figures.text(value) == shown and figures.cell(value) == (shown if shown != "0.0" and shown != "2.5"
                                                                    else str(value))
    assert figures.ratio(1, 0, "none") == figures.absent("none") and figures.rate(5, 0.0, "empty") == \
        figures.absent("empty")
    assert figures.dist([], "no samples") == figures.absent("no samples")
    assert figures.with_reasons({"a": figures.absent("why"), "b": float("nan")}) == {
        "a": None, "b": None, "absent": {"a": "why", "b": "not a finite number"}}
