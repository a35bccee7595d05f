"""`oculis eval run`: suite parsing by line, grading, the paired McNemar verdict, and offline runs that
give exactly the accuracy the routing implies."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from skips import ROUTING_DATA_FIX, needs_path

from oculis_cli.main import main
from oculis_measure.eval import core

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "training"))
from routing_data import data_dir

DATA = data_dir() / "mmlu" / "mmlu_astronomy.csv"


def results(tier: str, both: int, only_routed: int, only_base: int, neither: int) -> list[core.Result]:
    return ([core.Result(tier, False, True, True)] * both + [core.Result(tier, False, True, False)] * only_routed
            + [core.Result(tier, False, False, True)] * only_base + [core.Result(tier, False, False, False)] * neither)


def test_a_small_tier_with_no_disagreement_is_inconclusive_not_a_false_pass() -> None:
    v, why = core.verdict(core.paired(results("simple", 3, 0, 0, 0)), 2.0)
    assert v == core.INCONCLUSIVE and "n=3" in why


def test_a_large_tier_that_matches_the_baseline_passes() -> None:
    p = core.paired(results("simple", 1900, 5, 5, 90))
    assert p.delta_pp == 0 and core.verdict(p, 2.0)[0] == core.PASS


def test_a_significant_drop_beyond_the_tolerance_fails() -> None:
    p = core.paired(results("simple", 800, 0, 100, 100))  # 10 pp worse, 100 lost, none gained
    assert p.delta_pp == pytest.approx(-10) and p.p_value < 1e-10
    assert core.verdict(p, 2.0)[0] == core.FAIL


def test_a_drop_within_the_tolerance_but_an_interval_reaching_past_it_is_inconclusive() -> None:
    p = core.paired(results("simple", 180, 2, 4, 14))  # -1 pp at n=200
    assert core.verdict(p, 2.0)[0] == core.INCONCLUSIVE


def test_overall_is_the_worst_tier_and_the_strongest_tier_is_the_baseline_itself() -> None:
    rs = results("simple", 1000, 0, 0, 0) + results("standard", 3, 0, 0, 0) + results("complex", 50, 0, 0, 5)
    rep = core.summarise(rs, ["simple", "standard", "complex"], 2.0)
    by = {t["name"]: t for t in rep["tiers"]}
    assert by["simple"]["verdict"] == core.PASS and by["standard"]["verdict"] == core.INCONCLUSIVE
    assert by["complex"]["verdict"] is None and rep["overall"]["verdict"] == core.INCONCLUSIVE
    assert rep["overall"]["n"] == 1058 and set(rep["overall"]) >= {"n", "accuracy", "baseline_accuracy", "delta_pp",
                                                                    "verdict"}
    assert set(rep["tiers"][0]) >= {"name", "n", "accuracy", "escalated"}


def test_escalation_rate_counts_only_requests_that_could_escalate() -> None:
    rs = ([core.Result("simple", False, True, True)] * 90 + [core.Result("standard", True, True, True)] * 10
          + [core.Result("complex", True, True, True)] * 5 + [core.Result("complex", False, True, True)] * 95)
    o = core.summarise(rs, ["simple", "standard", "complex"], 2.0)["overall"]
    assert o["escalated"] == 15 and o["escalation_rate"] == round(15 / 105, 4)  # 95 started at the top
    assert o["escalation_denominator"].startswith("105 ")


@pytest.mark.parametrize(("line", "says"), [
    ("not json", "line 7: not JSON"),
    ("[1, 2]", "line 7: expected a JSON object"),
    ('{"outcomes": {"a": true}}', 'line 7: needs "prompt"'),
    ('{"prompt": "x"}', 'line 7: offline mode needs "outcomes"'),
    ('{"prompt": "x", "outcomes": {"a": "yes"}}', 'line 7: outcomes.a must be true or false'),
])
def test_bad_offline_lines_name_the_line_and_the_fix(line: str, says: str) -> None:
    with pytest.raises(core.SuiteLineError, match=says):
        core.parse_line(7, line, offline=True)


@pytest.mark.parametrize(("line", "says"), [
    ('{"prompt": "x"}', 'needs "expected"'),
    ('{"prompt": "x", "expected": "a", "match": "fuzzy"}', "match 'fuzzy' is not one of"),
    ('{"prompt": "x", "expected": "(", "match": "regex"}', "not a valid regex"),
    ('{"prompt": "x", "expected": "a", "match": "json_field"}', 'needs "field"'),
])
def test_bad_online_lines_name_the_line_and_the_fix(line: str, says: str) -> None:
    with pytest.raises(core.SuiteLineError, match=says):
        core.parse_line(3, line, offline=False)


@pytest.mark.parametrize(("answer", "spec", "ok"), [
    (" Paris \n", {"expected": "Paris"}, True),
    ("paris", {"expected": "Paris"}, False),
    ("The answer is B.", {"expected": r"\bB\b", "match": "regex"}, True),
    ('{"answer": {"value": 42}}', {"expected": "42", "match": "json_field", "field": "answer.value"}, True),
    ('{"items": ["x", "y"]}', {"expected": "y", "match": "json_field", "field": "items.1"}, True),
    ("not json", {"expected": "42", "match": "json_field", "field": "a"}, False),
])
def test_grading(answer: str, spec: dict[str, str], ok: bool) -> None:
    item = core.parse_line(1, json.dumps({"prompt": "q", **spec}), offline=False)
    assert core.grade(answer, item) is ok


def _suite_and_config(tmp_path: Path, rows: int = 160) -> tuple[Path, Path, list[dict[str, Any]]]:
    with DATA.open() as f:
        reader = csv.reader(f)
        next(reader)
        lines: list[dict[str, Any]] = [{"prompt": p, "outcomes": {"mixtral": w == "True", "gpt4": s == "True"}}
                 for p, w, s in list(reader)[:rows]]
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(x) + "\n" for x in lines))
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "mixtral", "provider": "vllm", "base_url": "http://127.0.0.1:1/v1"},
                      {"name": "gpt4", "provider": "vllm", "base_url": "http://127.0.0.1:2/v1"}],
        "routes": [{"name": "r", "tiers": [{"name": "cheap", "match": {"complexity_below": 0.5}, "upstream": "mixtral"},
                                           {"name": "strong", "upstream": "gpt4"}]}]}}))
    return suite, cfg, lines


@needs_path(DATA, "the routing data", ROUTING_DATA_FIX)
def test_offline_run_gives_exactly_the_accuracy_the_routing_implies(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from oculis import load_config
    from oculis_router.decide import RouteScorer

    suite, cfg, lines = _suite_and_config(tmp_path)
    code = main(["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite), "--by-tier", "-o", "json"])
    rep = json.loads(capsys.readouterr().out)
    scorer = RouteScorer(load_config(cfg).route("r"))
    routed = [scorer.score({"prompt": x["prompt"]})[1].tier.upstream for x in lines]
    right = [x["outcomes"][u] for x, u in zip(lines, routed, strict=True)]
    assert rep["overall"]["n"] == len(lines)
    assert rep["overall"]["accuracy"] == round(sum(right) / len(lines), 4)
    strong = [x["outcomes"]["gpt4"] for x in lines]
    assert rep["overall"]["baseline_accuracy"] == round(sum(strong) / len(lines), 4)
    assert {t["name"]: t["n"] for t in rep["tiers"]} == {"cheap": routed.count("mixtral"),
                                                        "strong": routed.count("gpt4")}
    assert code == core.EXIT_CODES[rep["overall"]["verdict"]]


@needs_path(DATA, "the routing data", ROUTING_DATA_FIX)
def test_a_suite_with_bad_lines_is_refused_by_line_number_unless_skipped(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    suite, cfg, _ = _suite_and_config(tmp_path, rows=20)
    text = suite.read_text().splitlines()
    text[4] = "{broken"
    text[9] = '{"prompt": "q", "outcomes": {"mixtral": true}}'  # the baseline's outcome is missing
    suite.write_text("\n".join(text) + "\n")
    args = ["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite), "-o", "json"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "line 5: not JSON" in err and "line 10: outcomes has no entry for upstream gpt4" in err
    assert "--skip-bad-lines" in err and "Traceback" not in err
    code = main([*args, "--skip-bad-lines"])
    rep = json.loads(capsys.readouterr().out)
    assert rep["overall"]["n"] == 18 and rep["skipped_lines"] == 2 and code in (0, 3, 4)


def test_unknown_route_and_missing_suite_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    seed = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
    assert main(["eval", "run", "--config", str(seed), "--route", "nope", "--suite", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and len(err.strip().splitlines()) == 1
    assert main(["eval", "run", "--config", str(seed), "--route", "adaptive", "--suite", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "cannot read --suite" in err and len(err.strip().splitlines()) == 1


def test_offline_outcomes_may_be_keyed_by_upstream_or_by_tier() -> None:
    by_tier = core.parse_line(1, json.dumps({"prompt": "q", "outcomes": {"cheap": False, "strong": True}}), True)
    assert core.offline_result(by_tier, "cheap", "mixtral", False, "gpt4", "strong") == core.Result(
        "cheap", False, False, True)
    by_upstream = core.parse_line(2, json.dumps({"prompt": "q", "outcomes": {"mixtral": True, "gpt4": False}}), True)
    assert core.offline_result(by_upstream, "cheap", "mixtral", True, "gpt4", "strong") == core.Result(
        "cheap", True, True, False)
