"""oculis_measure.eval.decision: the cost at matched quality of each alternative and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oculis_cli.main import main
from oculis_measure.eval import decision as d


def rows(n: int, signal: bool, seed: int = 0, kind: str | None = "chat") -> list[d.Row]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        hard = rng.random() < 0.5
        weak = bool(rng.random() < (0.3 if hard else 0.95))
        strong = bool(rng.random() < 0.95)
        c = (0.7 + 0.3 * rng.random() if hard else 0.3 * rng.random()) if signal else rng.random()
        out.append(d.Row(c, weak, strong, strong if c >= 0.5 else weak, 1.0, 10.0, 10.0 if c >= 0.5 else 1.0, kind))
    return out


def test_routing_pays_when_the_score_finds_the_hard_prompts() -> None:
    got = d.decide(rows(400, signal=True), 2.0)
    assert got["verdict"] == d.PAYS
    assert got["apgr_ci"][0] > 0.5 and 0 < got["saving_ci"][0] <= got["saving"] <= got["saving_ci"][1]
    names = [a["name"] for a in got["alternatives"]]
    assert names[:3] == ["route as configured", "all-weak", "all-strong"]


def test_routing_does_not_pay_when_the_score_is_a_coin() -> None:
    got = d.decide(rows(400, signal=False), 2.0)
    assert got["verdict"] == d.DOES_NOT_PAY and "includes 0.5" in got["line"]
    assert got["saving"] is None


def test_too_few_rows_gives_no_apgr() -> None:
    got = d.decide(rows(20, signal=True), 2.0)
    assert got["verdict"] == d.TOO_FEW and got["apgr"] is None and "20 rows" in got["line"]


def test_same_model_twice_cannot_be_judged() -> None:
    got = d.decide(rows(400, signal=True), 2.0, same_model="gpt-4")
    assert got["verdict"] == d.CANNOT and "same model (gpt-4)" in got["line"] and got["alternatives"] == []


def test_outcomes_all_one_value_cannot_be_judged() -> None:
    same = [d.Row(0.1 * i % 1, True, True, True, 1.0, 10.0, 1.0) for i in range(100)]
    got = d.decide(same, 2.0)
    assert got["verdict"] == d.CANNOT and got["apgr"] is None


def test_one_kind_only_is_a_caveat_naming_it() -> None:
    got = d.decide(rows(400, signal=True, kind="mmlu"), 2.0)
    assert any("one kind only (mmlu)" in c for c in got["caveats"])
    mixed = rows(200, True, kind="a") + rows(200, True, 1, kind="b")
    assert not any("one kind" in c for c in d.decide(mixed, 2.0)["caveats"])


def test_weak_within_tolerance_is_a_static_route() -> None:
    r = [d.Row(i / 100, True, i % 50 != 0, True, 1.0, 10.0, 1.0) for i in range(100)]
    got = d.decide(r, 5.0)
    assert got["verdict"] == d.DOES_NOT_PAY and "static route" in got["line"]


def test_threshold_share_is_the_smallest_reaching_the_target() -> None:
    score = np.array([0.9, 0.8, 0.1, 0.2])
    weak = np.array([0.0, 0.0, 1.0, 1.0])
    strong = np.ones(4)
    assert d.threshold_share(score, weak, strong, 1.0) == 0.5
    assert d.threshold_share(score, weak, np.zeros(4), 1.0) is None


def test_unpriced_upstreams_count_strong_calls() -> None:
    r = [dataclass_replace(x) for x in rows(200, signal=True)]
    got = d.decide(r, 2.0)
    assert got["cost_unit"] == "strong calls" and any("no upstream prices" in c for c in got["caveats"])


def dataclass_replace(x: d.Row) -> d.Row:
    import dataclasses

    return dataclasses.replace(x, cost_weak=0.0, cost_strong=0.0, cost_routed=0.0)


CONFIG = """oculis:
  upstreams:
    - {name: small, provider: vllm, base_url: "http://127.0.0.1:9/v1", model: MODEL}
    - {name: big, provider: openai, model: gpt-4o}
  routes:
    - name: r
      tiers:
        - {name: cheap, complexity_below: 0.5, upstream: small}
        - {name: strong, upstream: big}
"""


def write(tmp_path: Path, n: int, model: str = "m") -> tuple[Path, Path]:
    cfg, suite = tmp_path / "cfg.yaml", tmp_path / "suite.jsonl"
    cfg.write_text(CONFIG.replace("MODEL", model))
    suite.write_text("".join(json.dumps({"prompt": f"question {i}: what is {i} + {i}?", "kind": "qa",
                                         "outcomes": {"small": i % 3 == 0, "big": True}}) + "\n" for i in range(n)))
    return cfg, suite


def test_eval_run_by_tier_prints_the_alternatives_and_the_verdict_and_json_carries_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, suite = write(tmp_path, 30)
    main(["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite), "--by-tier"])
    text = capsys.readouterr().out
    assert "cost at matched quality (30 rows" in text and "all-strong" in text and "threshold at strong" in text
    assert "TOO FEW ROWS: 30 rows with both tiers' outcomes" in text and "note: one kind only (qa)" in text
    main(["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite), "-o", "json"])
    dec = json.loads(capsys.readouterr().out)["decision"]
    assert dec["verdict"] == d.TOO_FEW and dec["apgr"] is None and dec["saving"] is None


def test_eval_run_with_one_model_as_both_tiers_says_it_cannot_judge(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg, suite = write(tmp_path, 60, model="gpt-4o")
    main(["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite), "-o", "json"])
    dec = json.loads(capsys.readouterr().out)["decision"]
    assert dec["verdict"] == d.CANNOT and "same model (gpt-4o)" in dec["line"]
