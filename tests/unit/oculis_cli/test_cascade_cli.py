"""`oculis route analyze` (a sample and a window) and `oculis eval run` (offline) print the cascade cost
of escalating on the answer next to the routed-only cost, as a table and as JSON."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from oculis import load_config
from oculis.router import AnswerCheck
from oculis_cli import clusterinputs
from oculis_cli.main import main
from oculis_measure.cost.core import Counters
from oculis_measure.eval import core

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
SAMPLE = "".join(json.dumps({"prompt": p}) + "\n" for p in ["hi", "thanks", "what is 2+2?"])


def seed_with_on_answer(tmp_path: Path, on_answer: dict[str, Any] | None = None) -> Path:
    doc = yaml.safe_load(SEED.read_text())
    route = next(r for r in doc["oculis"]["routes"] if r["name"] == "adaptive")
    route["escalation"]["on_answer"] = on_answer or {"min_mean_logprob": -1.0}
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


GRADED = {"verifier": {"upstream": "openai-gpt4o", "min_score": 7, "max_tokens": 8}}  # gpt-4o grades 8B and 70B


def analyze(tmp_path: Path, *extra: str) -> list[str]:
    sample = tmp_path / "sample.jsonl"
    sample.write_text(SAMPLE)
    return ["route", "analyze", "--config", str(SEED), "--route", "adaptive", "--sample", str(sample), *extra]


def test_a_samples_cascade_cost_uses_the_given_escalation_rate(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(analyze(tmp_path, "-o", "json")) == 0
    none = json.loads(capsys.readouterr().out)["cascade"]
    assert none["total"]["cascade_cost"] == none["total"]["routed_only_cost"] > 0
    assert "not configured" in none["p_esc_source"] and "256 output tokens" in none["tokens"]
    assert main(analyze(tmp_path, "-o", "json", "--answer-escalation-rate", "0.25", "--output-tokens", "100")) == 0
    rep = json.loads(capsys.readouterr().out)["cascade"]
    assert rep["tiers"][0]["p_esc"] == 0.25 and "--answer-escalation-rate 0.25" in rep["p_esc_source"]
    assert rep["total"]["routed_only_cost"] < rep["total"]["cascade_cost"] < rep["all_strongest"]["cost"]
    assert "100 output tokens" in rep["tokens"]


def test_a_samples_table_prints_routed_only_and_cascade_next_to_the_tier_split(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(analyze(tmp_path, "--answer-escalation-rate", "0.1")) == 0
    printed = capsys.readouterr().out
    assert "cascade (escalation on the answer) vs routed-only" in printed
    assert "routed-only $" in printed and "cascade $" in printed and "saving vs all-complex: routed-only" in printed
    assert "p_esc: --answer-escalation-rate 0.1" in printed and "verifier: $0" in printed


@pytest.mark.parametrize(("flags", "says"), [(["--answer-escalation-rate", "2"], "outside 0..1"),
                                              (["--answer-escalation-rate", "x"], "not a number"),
                                              (["--output-tokens", "0"], "--output-tokens 0")])
def test_a_bad_cascade_flag_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                        says: str) -> None:
    assert main(analyze(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def window_counters() -> Counters:
    return Counters(
        requests={("adaptive", "simple", "llama-8b", "ok"): 600, ("adaptive", "standard", "llama-70b", "ok"): 300,
                  ("adaptive", "complex", "openai-gpt4o", "ok"): 100},
        prompt_tokens={"llama-8b": 60_000, "llama-70b": 30_000, "openai-gpt4o": 10_000},
        completion_tokens={"llama-8b": 60_000, "llama-70b": 30_000, "openai-gpt4o": 10_000},
        cost={"llama-8b": 0.0078, "llama-70b": 0.0225, "openai-gpt4o": 0.125},
        escalations={("adaptive", "low_answer_confidence"): 100})


@pytest.fixture
def fake_prometheus(monkeypatch: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def opened(args: Any) -> Iterator[object]:
        yield object()

    monkeypatch.setattr(clusterinputs, "open_prometheus", opened)
    monkeypatch.setattr(clusterinputs, "counters", lambda prom, t0, t1, sel="": window_counters())


def test_a_windows_escalation_rate_is_measured_from_the_routers_counters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_prometheus: None) -> None:
    cfg = seed_with_on_answer(tmp_path)
    args = ["route", "analyze", "--route", "adaptive", "--since", "1h", "--config", str(cfg)]
    assert main([*args, "-o", "json", "--answer-escalation-rate", "0.9"]) == 0
    rep = json.loads(capsys.readouterr().out)["cascade"]
    assert rep["tiers"][0]["p_esc"] == pytest.approx(100 / 1000)  # replaced / (900 kept on checked tiers + 100)
    assert rep["p_esc_source"].startswith("the window")
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "saving vs all-complex" in printed and "p_esc: the window" in printed and "cascade $" in printed


def test_eval_offline_reports_the_oracle_cascade_cost_and_accuracy(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite.jsonl"
    right = {"llama-8b": True, "llama-70b": True, "openai-gpt4o": True}
    weak_wrong = {"llama-8b": False, "llama-70b": True, "openai-gpt4o": True}
    suite.write_text("".join(json.dumps({"prompt": p, "outcomes": o}) + "\n"
                             for p, o in [("hi", right), ("thanks", weak_wrong), ("what is 2+2?", right)]))
    args = ["eval", "run", "--config", str(SEED), "--route", "adaptive", "--suite", str(suite)]
    main([*args, "-o", "json"])
    rep = json.loads(capsys.readouterr().out)
    casc = rep["cascade"]
    assert casc["accuracy"]["cascade"] == 1.0 and casc["accuracy"]["routed"] == rep["overall"]["accuracy"]
    assert casc["total"]["cascade_cost"] > casc["total"]["routed_only_cost"]
    assert "oracle verifier" in casc["p_esc_source"] and "upper bound" in casc["bounds"]
    main(args)
    printed = capsys.readouterr().out
    assert "cascade (escalation on the answer) vs routed-only" in printed
    assert "accuracy: routed-only" in printed and "bounds: oracle verifier" in printed


def test_a_samples_cascade_cost_pays_the_verifiers_gradings(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    sample = tmp_path / "sample.jsonl"
    sample.write_text(SAMPLE)
    argv = ["route", "analyze", "--route", "adaptive", "--sample", str(sample), "--answer-escalation-rate", "0"]
    assert main([*argv, "--config", str(SEED), "-o", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)["cascade"]
    assert main([*argv, "--config", str(seed_with_on_answer(tmp_path, GRADED)), "-o", "json"]) == 0
    graded = json.loads(capsys.readouterr().out)["cascade"]
    # No answer replaced (p_esc 0): the cascade costs the routed attempts plus one grading per answer below gpt-4o.
    assert graded["verifier"]["graders"] == {"openai-gpt4o": ["simple", "standard"]}
    assert graded["verifier"]["dollars"] > 0
    assert graded["total"]["cascade_cost"] == pytest.approx(plain["total"]["routed_only_cost"]
                                                            + graded["verifier"]["dollars"], abs=1e-9)
    assert graded["total"]["routed_only_cost"] == plain["total"]["routed_only_cost"]
    assert graded["unchecked"] == {}


def test_eval_offline_oracle_cascade_pays_the_routes_verifier(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    suite = tmp_path / "suite.jsonl"
    weak_wrong = {"llama-8b": False, "llama-70b": True, "openai-gpt4o": True}
    suite.write_text("".join(json.dumps({"prompt": p, "outcomes": weak_wrong}) + "\n" for p in ("hi", "thanks")))
    out = {}
    for name, on_answer in (("logprob", None), ("graded", GRADED)):
        (tmp_path / name).mkdir()
        cfg = seed_with_on_answer(tmp_path / name, on_answer)
        main(["eval", "run", "--config", str(cfg), "--route", "adaptive", "--suite", str(suite), "-o", "json"])
        out[name] = json.loads(capsys.readouterr().out)["cascade"]
    # Both 8B answers are wrong: the oracle escalates them to 70B, which is right; the verifier graded both steps.
    assert out["logprob"]["verifier"]["dollars"] == 0.0 and out["graded"]["verifier"]["dollars"] > 0
    assert out["graded"]["total"]["cascade_cost"] == pytest.approx(
        out["logprob"]["total"]["cascade_cost"] + out["graded"]["verifier"]["dollars"], abs=1e-9)
    assert "estimated per suite prompt" in out["graded"]["verifier"]["source"]


def test_eval_online_prices_the_verifier_as_an_estimate_and_says_so() -> None:
    cfg = load_config(SEED)
    route, ups = cfg.route("adaptive"), {u.name: u for u in cfg.upstreams}
    graded = route.model_copy(update={"escalation": route.escalation.model_copy(
        update={"on_answer": AnswerCheck.model_validate(GRADED)})})
    rs = [core.Result("simple", False, True, True, prompt_tokens=10, output_tokens=5)] * 4
    rep = core.online_cascade(graded, ups, rs)
    assert rep["verifier"]["graders"] == {"openai-gpt4o": ["simple", "standard"]}
    assert rep["verifier"]["source"].startswith("estimated from the answers' usage, not measured")
    assert rep["total"]["cascade_cost"] == pytest.approx(rep["total"]["routed_only_cost"] + rep["verifier"]["dollars"])


def test_eval_online_measures_the_rate_from_the_answer_escalation_header() -> None:
    cfg = load_config(SEED)
    route, ups = cfg.route("adaptive"), {u.name: u for u in cfg.upstreams}
    rs = ([core.Result("simple", False, True, True, prompt_tokens=10, output_tokens=5)] * 6
          + [core.Result("standard", True, True, True, prompt_tokens=10, output_tokens=5, answer_escalated=True)] * 2
          + [core.Result("complex", False, True, True, prompt_tokens=10, output_tokens=5)] * 2)
    rep = core.online_cascade(route, ups, rs)
    assert rep["tiers"][0]["p_esc"] == pytest.approx(2 / 8)  # 2 replaced / (6 kept + 2 replaced)
    assert rep["tiers"][1]["p_esc"] == 0.0  # the 70B tier kept both answers it gave
    assert rep["tiers"][0]["routed_requests"] == 8  # a replaced answer was routed to the tier below
    assert "measured online" in rep["p_esc_source"]


def test_figures_reproducible_from_the_table_oracle_p_esc_is_per_item_and_the_mean_figure_is_printed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # QA2 #29: items differ in tokens and in where they are wrong, so the formula applied to the printed
    # (average) p_esc is not the per-item cascade $; the table says which is which and prints both.
    suite = tmp_path / "suite.jsonl"
    wrong = {"llama-8b": False, "llama-70b": True, "openai-gpt4o": True}
    right = {"llama-8b": True, "llama-70b": True, "openai-gpt4o": True}
    suite.write_text("".join(json.dumps({"prompt": p, "outcomes": o}) + "\n"
                             for p, o in [("hi", wrong), ("thanks, that was kind of you, have a nice day", right)]))
    args = ["eval", "run", "--config", str(SEED), "--route", "adaptive", "--suite", str(suite)]
    main([*args, "-o", "json"])
    casc = json.loads(capsys.readouterr().out)["cascade"]
    assert "PER ITEM" in casc["p_esc_source"] and casc["formula"].startswith("per item")
    mean, per_item = casc["total"]["cascade_cost_at_mean_p_esc"], casc["total"]["cascade_cost"]
    assert mean != pytest.approx(per_item)
    main(args)
    assert "expected value at the p_esc column" in capsys.readouterr().out
