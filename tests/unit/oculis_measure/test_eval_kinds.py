"""Routing quality per kind of traffic (`oculis eval run`, `status --check-deps --suite`): APGR and
CPT(50%) with a bootstrap CI per `kind` of the suite, and a WARN naming each kind the route's head is
not shown to route better than random."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oculis_cli.main import main
from oculis_measure.eval import core
from oculis_measure.eval.kinds import NOT_APPLICABLE, OK, WARN, Scored, by_kind, kind_row, verdict

CONFIG = """oculis:
  upstreams:
    - {name: small, provider: vllm, base_url: "http://127.0.0.1:9/v1", model: m}
    - {name: big, provider: openai, model: gpt-4o}
  routes:
    - name: r
      tiers:
        - {name: cheap, complexity_below: 0.5, upstream: small}
        - {name: strong, upstream: big}
"""


def scored(kind: str, n: int, aligned: bool, seed: int = 0) -> list[Scored]:
    """Half the prompts need the strong model; an aligned score ranks those first, an inverted one last."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        hard = i % 2 == 0
        c = float(rng.uniform(0.6, 1.0) if hard == aligned else rng.uniform(0.0, 0.4))
        out.append(Scored(kind, c, weak=not hard, strong=True))
    return out


def test_a_score_that_ranks_the_hard_prompts_first_is_ok_and_an_inverted_one_warns() -> None:
    good = kind_row("mmlu", scored("mmlu", 60, aligned=True))
    assert good.verdict == OK and good.apgr is not None and good.apgr > 0.7 and good.ci is not None
    assert good.ci[0] > 0.5 and good.cpt50 is not None and good.cpt50 < 0.5
    bad = kind_row("chat", scored("chat", 60, aligned=False))
    assert bad.verdict == WARN and bad.apgr is not None and bad.apgr < 0.3 and "worse than random" in bad.reason
    assert bad.cpt50 is not None and bad.cpt50 > 0.5


def test_too_few_lines_or_no_gap_are_not_judged_better_than_random() -> None:
    few = kind_row("gsm8k", scored("gsm8k", 10, aligned=True))
    assert few.verdict == WARN and "too few" in few.reason
    same = kind_row("faq", [Scored("faq", 0.1 * i, True, True) for i in range(30)])
    assert same.verdict == NOT_APPLICABLE and same.apgr is None and "equally good" in same.reason
    missing = kind_row("x", [Scored("x", 0.5, None, True)])
    assert missing.verdict == NOT_APPLICABLE and missing.scored == 0


def test_rows_per_kind_then_all_and_the_warn_names_each_bad_kind() -> None:
    rows = by_kind(scored("mmlu", 60, True) + scored("chat", 60, False, 1) + [Scored(None, 0.5, True, True)])
    assert [r.kind for r in rows] == ["mmlu", "chat", "(no kind)", "all"]
    v, why = verdict(rows)
    assert v == WARN and why.startswith("not better than random on chat (worse than random") and "mmlu" not in why
    assert "oculis classifier fit" in why and "escalation.on_answer" in why
    assert verdict(by_kind(scored("mmlu", 60, True)))[0] == OK


def test_a_suite_line_kind_is_read_and_a_bad_one_refused() -> None:
    item = core.parse_line(1, json.dumps({"prompt": "p", "kind": " chat ", "outcomes": {"a": True}}), True)
    assert item.kind == "chat"
    with pytest.raises(core.SuiteLineError, match=r"line 3: kind must be a short non-empty string"):
        core.parse_line(3, json.dumps({"prompt": "p", "kind": 7, "outcomes": {"a": True}}), True)


def suite_lines() -> list[dict[str, object]]:
    """`qa` is multiple choice, a kind the packaged head has evidence for: it scores the long questions as
    more complex, and they are the ones the small model fails (the head is right). `chat` is open-ended
    chat, where the head has none: its kind guard gives each prompt a coin, so a head that would rank chat
    backwards (the short turns are the ones the small model fails here) routes it like a random split."""
    lines = []
    for i in range(40):
        long = i % 2 == 0
        question = f"Question {i}: " + ("which statement explains the derivation of the result in full detail? " * 6
                                        if long else "which is right?")
        lines.append({"prompt": question + "\nA. the first\nB. the second\nC. the third\nD. the fourth\nAnswer:",
                      "kind": "qa", "outcomes": {"small": not long, "big": True}})
        story = "tell me a story about my cat and her long afternoon naps " * 6
        chat = f"hey there, this is chat number {i}: " + (story if long else "hi, how are you?")
        lines.append({"prompt": chat, "kind": "chat", "outcomes": {"small": long, "big": True}})
    return lines


def write_suite(tmp_path: Path) -> tuple[Path, Path]:
    cfg, suite = tmp_path / "cfg.yaml", tmp_path / "suite.jsonl"
    cfg.write_text(CONFIG)
    suite.write_text("".join(json.dumps(line) + "\n" for line in suite_lines()))
    return cfg, suite


def test_eval_run_reports_apgr_per_kind_and_warns_naming_the_kind(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cfg, suite = write_suite(tmp_path)
    main(["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite), "-o", "json"])
    rep = json.loads(capsys.readouterr().out)["kinds"]
    rows = {r["kind"]: r for r in rep["rows"]}
    assert set(rows) == {"qa", "chat", "all"} and rep["weak_tier"] == "cheap" and rep["strong_tier"] == "strong"
    assert rows["qa"]["verdict"] == "OK" and rows["qa"]["apgr"] > 0.7 and rows["qa"]["ci"][0] > 0.5
    # a coin, not the head's backwards ranking: the interval reaches 0.5 from both sides
    assert rows["chat"]["verdict"] == "WARN" and rows["chat"]["ci"][0] < 0.5 < rows["chat"]["ci"][1]
    assert rep["verdict"] == "WARN" and "on chat" in rep["reason"] and "on qa" not in rep["reason"]
    main(["eval", "run", "--config", str(cfg), "--route", "r", "--suite", str(suite)])
    text = capsys.readouterr().out
    assert "routing quality per kind: cheap (cheapest) vs strong (strongest)" in text
    assert "routing WARN: not better than random on chat (not better than random: APGR" in text


def test_status_check_deps_repeats_the_warning_for_a_route_with_a_suite(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    cfg, suite = write_suite(tmp_path)
    main(["status", "--check-deps", "--config", str(cfg), "--suite", f"r={suite}",
          "--kubeconfig", str(tmp_path / "none"), "-o", "json"])
    checks = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["section"] == "routing"]
    by_name = {c["name"]: c for c in checks}
    assert by_name["route r routes better than random on chat"]["status"] == "WARN"
    assert "not better than random" in by_name["route r routes better than random on chat"]["detail"]
    assert by_name["route r routes better than random on qa"]["status"] == "PASS"
    main(["status", "--check-deps", "--config", str(cfg), "--suite", "r", "--kubeconfig", str(tmp_path / "none"),
          "-o", "json"])
    bad = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["section"] == "routing"]
    assert bad[0]["status"] == "FAIL" and "ROUTE=FILE" in bad[0]["detail"]
