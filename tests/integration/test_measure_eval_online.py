"""`oculis eval run --url`: a suite sent through a real `oculis serve` (route) and to the strongest
tier's upstream by name, both answers graded; the tiers are the ones the router's headers name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from router_support import Fakes, start_router

from oculis_cli.main import main

PROMPTS = ["hi", "thanks", "good morning", "say hello", "what is 2+2?", "ok then"]


def test_online_eval_grades_routed_and_baseline_answers(fakes: Fakes, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    fakes.scripts["small"].reply = "wrong"  # the cheapest tier answers badly
    for name in ("large", "frontier"):
        fakes.scripts[name].reply = "hello"  # the fakes answer "<reply> from <name>"
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump(fakes.config()))
    router, url, _ = start_router(cfg, tmp_path / "router.log")
    try:
        suite = tmp_path / "suite.jsonl"
        lines = [{"prompt": p, "expected": r"^hello from", "match": "regex"} for p in PROMPTS]
        lines.append({"prompt": "exactly", "expected": "hello from frontier"})  # exact: only gpt-4o's answer
        suite.write_text("".join(json.dumps(x) + "\n" for x in lines))
        tiers = []
        with httpx.Client(headers={"authorization": "Bearer sk-client"}) as client:
            for x in lines:  # what the router does with each (the eval sends the same requests)
                r = client.post(url + "/v1/chat/completions", json={
                    "model": "adaptive", "temperature": 0, "max_tokens": 256,
                    "messages": [{"role": "user", "content": x["prompt"]}]})
                tiers.append(r.headers["x-oculis-tier"])
        monkeypatch.setenv("OCULIS_EVAL_KEY", "sk-client")
        code = main(["eval", "run", "--route", "adaptive", "--suite", str(suite), "--url", url, "--config", str(cfg),
                     "--api-key-env", "OCULIS_EVAL_KEY", "--by-tier", "-o", "json"])
        rep = json.loads(capsys.readouterr().out)
        assert rep["mode"] == "online" and rep["overall"]["n"] == len(lines)
        by = {t["name"]: t for t in rep["tiers"]}
        assert {n: t["n"] for n, t in by.items() if t["n"]} == {t: tiers.count(t) for t in set(tiers)}
        assert rep["overall"]["baseline_accuracy"] == 1.0  # gpt-4o's answer matches every line
        wrong = tiers[:-1].count("simple") + (tiers[-1] != "complex")
        assert rep["overall"]["accuracy"] == round((len(lines) - wrong) / len(lines), 4)
        simple = tiers.count("simple")
        if simple:
            assert by["simple"]["accuracy"] == 0.0 and rep["overall"]["verdict"] in ("FAIL", "INCONCLUSIVE")
        assert code == {"PASS": 0, "FAIL": 3, "INCONCLUSIVE": 4}[rep["overall"]["verdict"]]
    finally:
        router.terminate()
        router.wait(10)


def test_online_eval_against_a_router_that_is_down_exits_5(tmp_path: Path, fakes: Fakes,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from fake_upstreams import free_port

    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump(fakes.config()))
    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"prompt": "hi", "expected": "hello"}) + "\n")
    code = main(["eval", "run", "--route", "adaptive", "--suite", str(suite), "--config", str(cfg),
                 "--url", f"http://127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert code == 5 and "unreachable" in err and len(err.strip().splitlines()) == 1


def online_cascade(fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch, on_answer: dict[str, Any], prompts: tuple[str, ...],
                   ) -> dict[str, Any]:
    """`eval run` online against a real router whose route checks answers with `on_answer`: its cascade."""
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump(fakes.config(
        escalation={"enabled": True, "on_low_confidence": False, "on_answer": on_answer}, cache={"enabled": False})))
    router, url, _ = start_router(cfg, tmp_path / "router.log")
    try:
        suite = tmp_path / "suite.jsonl"
        suite.write_text("".join(json.dumps({"prompt": p, "expected": r"^hello from", "match": "regex"}) + "\n"
                                 for p in prompts))
        monkeypatch.setenv("OCULIS_EVAL_KEY", "sk-client")
        main(["eval", "run", "--route", "adaptive", "--suite", str(suite), "--url", url, "--config", str(cfg),
              "--api-key-env", "OCULIS_EVAL_KEY", "-o", "json"])
        out: dict[str, Any] = json.loads(capsys.readouterr().out)["cascade"]
        return out
    finally:
        router.terminate()
        router.wait(10)


def test_online_eval_measures_the_answer_escalation_rate_for_the_cascade_cost(
        fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The 8B tier is unsure of every answer (mean logprob -2.5 < -1.0): the router replaces each by the 70B's.
    for name, logprob in (("small", -2.5), ("large", -0.2)):
        fakes.scripts[name].give_logprobs, fakes.scripts[name].logprob = True, logprob
    casc = online_cascade(fakes, tmp_path, capsys, monkeypatch, {"min_mean_logprob": -1.0}, ("hi", "thanks", "ok then"))
    by = {t["tier"]: t for t in casc["tiers"]}
    assert by["simple"]["p_esc"] == 1.0 and "measured online: 3 answers replaced" in casc["p_esc_source"]
    assert by["standard"]["p_esc"] == 0.0  # the 70B tier kept the answers it gave
    assert by["simple"]["routed_requests"] == 3  # routed to the 8B tier, answered by the 70B one
    assert casc["total"]["cascade_cost"] > casc["total"]["routed_only_cost"] > 0  # the answers' usage, priced

def test_online_eval_prices_the_verifiers_gradings_as_an_estimate_from_the_answers_usage(
        fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fakes.scripts["claude"].anthropic_text = "Score: 9"  # every answer passes: the 8B tier answers each
    casc = online_cascade(fakes, tmp_path, capsys, monkeypatch, {"verifier": {"upstream": "claude", "min_score": 7}},
                          ("hi", "thanks", "ok then"))
    assert len(fakes.scripts["claude"].received) == 3  # the router graded each routed answer once
    assert casc["tiers"][0]["routed_requests"] == 3 and casc["tiers"][0]["p_esc"] == 0.0
    v = casc["verifier"]
    assert v["graders"] == {"claude": ["simple", "standard"]} and v["dollars"] > 0
    assert v["source"].startswith("estimated from the answers' usage, not measured")
    assert casc["total"]["cascade_cost"] == pytest.approx(casc["total"]["routed_only_cost"] + v["dollars"])
    assert casc["unchecked"] == {}

def test_online_eval_follows_a_chain_of_replaced_answers_to_the_tier_it_was_routed_to(
        fakes: Fakes, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    fakes.scripts["claude"].anthropic_text = "Score: 1"  # the 8B's and then the 70B's answer both fail
    casc = online_cascade(fakes, tmp_path, capsys, monkeypatch, {"verifier": {"upstream": "claude", "min_score": 7}},
                          ("hi", "thanks"))
    # x-oculis-replaced-tiers: simple,standard: routed to the 8B tier, both answers replaced, the last kept.
    simple, standard, complex_ = casc["tiers"]
    assert (simple["routed_requests"], simple["p_esc"], standard["p_esc"]) == (2, 1.0, 1.0)
    assert complex_["final_share"] == 1.0
    assert len(fakes.scripts["claude"].received) == 4  # each request graded twice
