"""The cascade cost model (escalation on the answer) next to the routed-only cost: pure arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis import Pricing, load_config
from oculis.router import AnswerCheck, Route, Verifier
from oculis_cli.checks_output import cascade_text
from oculis_measure.cost.core import Counters
from oculis_measure.route import cascade
from oculis_measure.route.cascade import Request, Tier
from oculis_measure.route.window import window_cascade
from oculis_router.answer_check import Grading, grading_overhead_tokens
from oculis_router.usage import Usage, cost_dollars

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
CFG = load_config(SEED)
ROUTE = CFG.route("adaptive")  # simple -> llama-8b (vllm), standard -> llama-70b (vllm), complex -> gpt-4o
UPSTREAMS = {u.name: u for u in CFG.upstreams}
CHEAP, MID, STRONG = Pricing(input_per_mtok=1, output_per_mtok=2), Pricing(input_per_mtok=10, output_per_mtok=20), \
    Pricing(input_per_mtok=100, output_per_mtok=200)


def one(p: Pricing, prompt: int = 1000, out: int = 500) -> float:
    return cost_dollars(p, Usage(prompt, out, 0, 0))


def three(p0: float, p1: float) -> list[Tier]:
    return [Tier("a", "up-a", CHEAP, p0), Tier("b", "up-b", MID, p1), Tier("c", "up-c", STRONG, 0.0)]


def test_the_cascade_recurses_to_the_strongest_tier_weighting_each_step_by_its_escalation_share() -> None:
    tiers = three(0.2, 0.5)
    r = Request(0, 1000, 500)
    want = one(CHEAP) + 0.2 * (one(MID) + 0.5 * one(STRONG))
    assert cascade.cascade_cost(tiers, r) == pytest.approx(want)
    rep = cascade.report(tiers, [r, Request(1, 1000, 500), Request(2, 1000, 500)], "test", "test")
    rows = {t["tier"]: t for t in rep["tiers"]}
    assert rows["a"]["routed_only_cost"] == pytest.approx(one(CHEAP))
    assert rows["b"]["cascade_cost"] == pytest.approx(one(MID) + 0.5 * one(STRONG))
    assert rows["c"]["cascade_cost"] == rows["c"]["routed_only_cost"] == pytest.approx(one(STRONG))
    assert rep["total"]["cascade_cost"] == pytest.approx(want + one(MID) + 0.5 * one(STRONG) + one(STRONG))
    assert rep["all_strongest"]["cost"] == pytest.approx(3 * one(STRONG))
    # Where the final answers come from: a's request ends at a 80%, b 10%, c 10%; b's at b 50%, c 50%.
    assert [rows[n]["final_share"] for n in "abc"] == pytest.approx([0.8 / 3, 0.6 / 3, 1.6 / 3], abs=1e-4)
    assert rep["all_strongest"]["cascade_saving_pct"] == pytest.approx(
        100 * (1 - rep["total"]["cascade_cost"] / (3 * one(STRONG))), abs=0.01)


@pytest.mark.parametrize(("p", "want"), [(0.0, one(CHEAP)), (1.0, one(CHEAP) + one(MID) + one(STRONG))])
def test_no_escalation_costs_the_routed_tier_only_and_certain_escalation_pays_every_tier(p: float, want: float
                                                                                         ) -> None:
    tiers = three(p, p)
    assert cascade.cascade_cost(tiers, Request(0, 1000, 500)) == pytest.approx(want)
    rep = cascade.report(tiers, [Request(0, 1000, 500)], "test", "test")
    assert rep["total"]["routed_only_cost"] == pytest.approx(one(CHEAP))
    assert rep["total"]["cascade_overhead_pct"] == pytest.approx(100 * (want / one(CHEAP) - 1), abs=0.01)


def test_a_known_outcome_per_request_overrides_the_tier_share() -> None:
    tiers = three(0.5, 0.5)
    wrong_then_right = Request(0, 1000, 500, p_esc=(1.0, 0.0, 0.0))
    assert cascade.cascade_cost(tiers, wrong_then_right) == pytest.approx(one(CHEAP) + one(MID))
    assert cascade.reach(tiers, wrong_then_right) == [0.0, 1.0, 0.0]


def test_a_single_tier_route_has_nothing_to_escalate_to() -> None:
    tiers = [Tier("only", "up", CHEAP, 0.9)]  # a share set on the last tier is never used
    rep = cascade.report(tiers, [Request(0, 1000, 500, count=3)], "test", "test")
    assert rep["total"]["routed_only_cost"] == rep["total"]["cascade_cost"] == rep["all_strongest"]["cost"]
    assert rep["tiers"][0]["p_esc"] is None and rep["all_strongest"]["routed_only_saving_pct"] == 0.0


def test_an_unpriced_upstream_is_named_never_silently_zero() -> None:
    tiers = [Tier("a", "free-a", Pricing(), 0.3), Tier("b", "up-b", STRONG)]
    rep = cascade.report(tiers, [Request(0, 1000, 500)], "test", "test")
    assert rep["unpriced"] == ["free-a"] and "free-a" in rep["unpriced_note"]
    assert "pricing" in rep["unpriced_note"] and not rep["tiers"][0]["priced"]
    assert "(unpriced)" in cascade_text(rep)
    gone = cascade.report([Tier("a", "up-a", CHEAP, 0.3), Tier("b", "missing", None)], [Request(0, 10, 10)], "t", "t")
    assert gone["unpriced"] == ["missing"] and gone["all_strongest"]["routed_only_saving_pct"] is None


def test_without_a_verifier_the_check_is_zero_and_says_why() -> None:
    rep = cascade.report(three(0.1, 0.1), [Request(0, 1000, 500)], "test", "test")
    assert rep["verifier"]["dollars"] == 0.0 and "no extra call" in rep["verifier"]["why"]
    assert "no escalation.on_answer.verifier" in rep["verifier"]["why"]


JUDGE = Pricing(input_per_mtok=3, output_per_mtok=15)


def test_a_verifier_grading_is_priced_per_request_on_the_answer_it_grades_plus_the_rubric() -> None:
    # Tier a (cheap) is graded by "judge" (100 rubric/template tokens, max_tokens 8); b is the last tier.
    g = Grading("judge", JUDGE, 100, 8)
    tiers = [Tier("a", "up-a", CHEAP, 0.25, g), Tier("b", "up-b", STRONG, 0.0, g)]
    r = Request(0, 1000, 500)
    # attempt(a) = (1000 x 1 + 500 x 2) / 1e6 = 0.002; grading = ((1000 + 500 + 100) x 3 + 8 x 15) / 1e6 = 0.00492;
    # b = (1000 x 100 + 500 x 200) / 1e6 = 0.2, reached by a quarter: 0.002 + 0.00492 + 0.25 x 0.2 = 0.05692.
    assert cascade.grading(tiers[0], r) == pytest.approx(0.00492)
    assert cascade.cascade_cost(tiers, r) == pytest.approx(0.05692)
    rep = cascade.report(tiers, [r, Request(1, 1000, 500)], "test", "test")
    assert rep["tiers"][1]["cascade_cost"] == pytest.approx(0.2)  # the last tier is never graded
    assert rep["total"]["cascade_cost"] == pytest.approx(0.25692)
    assert rep["total"]["routed_only_cost"] == pytest.approx(0.202)  # no check, no grading
    assert rep["verifier"]["graders"] == {"judge": ["a"]} and rep["verifier"]["dollars"] == pytest.approx(0.00492)
    assert "judge grades a" in rep["verifier"]["why"] and "$0.00492" in rep["verifier"]["why"]
    assert rep["verifier"]["why"].endswith("; estimated from the requests' tokens")  # the source, filled in
    assert "verifier: $0.00492 in the cascade cost: judge grades a" in cascade_text(rep)
    # Three alike requests in one Request: the tokens are totals, the rubric and the score are per request.
    assert cascade.grading(tiers[0], Request(0, 3000, 1500, count=3)) == pytest.approx(3 * 0.00492)


def test_the_verifier_total_weights_each_tiers_grading_by_the_share_that_reaches_it() -> None:
    g = Grading("judge", JUDGE, 100, 8)
    tiers = [Tier("a", "up-a", CHEAP, 0.5, g), Tier("b", "up-b", MID, 0.5, g), Tier("c", "up-c", STRONG, 0.0, g)]
    r = Request(0, 1000, 500)
    rep = cascade.report(tiers, [r], "test", "test")
    assert rep["verifier"]["dollars"] == pytest.approx(1.5 * 0.00492)  # a always, b half the time, c never
    assert rep["verifier"]["graders"] == {"judge": ["a", "b"]}
    want = one(CHEAP) + 0.00492 + 0.5 * (one(MID) + 0.00492 + 0.5 * one(STRONG))
    assert rep["total"]["cascade_cost"] == pytest.approx(want)


def test_an_unpriced_verifier_upstream_is_named_like_an_unpriced_tier() -> None:
    for free in (Grading("judge", Pricing(), 100, 8), Grading("judge", None, 100, 8)):
        tiers = [Tier("a", "up-a", CHEAP, 0.2, free), Tier("b", "up-b", STRONG)]
        rep = cascade.report(tiers, [Request(0, 1000, 500)], "test", "test")
        assert rep["unpriced"] == ["judge"] and "judge" in rep["unpriced_note"]
        assert rep["total"]["cascade_cost"] == pytest.approx(one(CHEAP) + 0.2 * one(STRONG))


def with_verifier(route: Route, upstream: str = "openai-gpt4o", logprob: float | None = None) -> Route:
    check = AnswerCheck(min_mean_logprob=logprob, verifier=Verifier(upstream=upstream, min_score=7, max_tokens=8))
    return route.model_copy(update={"escalation": route.escalation.model_copy(update={"on_answer": check})})


def test_a_hosted_tier_is_checked_when_the_route_has_a_verifier_and_each_checked_tier_carries_it() -> None:
    hosted = {**UPSTREAMS, "llama-70b": UPSTREAMS["openai-gpt4o"].model_copy(update={"name": "llama-70b"})}
    graded = with_verifier(ROUTE)
    tiers, why = cascade.tiers_for(graded, hosted, 0.3, what_if=False)
    assert [t.p_esc for t in tiers] == [0.3, 0.3, 0.0] and why == {}
    assert graded.escalation.on_answer is not None and graded.escalation.on_answer.verifier is not None
    v = graded.escalation.on_answer.verifier
    want = Grading("openai-gpt4o", UPSTREAMS["openai-gpt4o"].pricing, grading_overhead_tokens(v), 8)
    assert [t.grader for t in tiers] == [want, want, None]
    # The logprob check alone leaves the hosted tier unchecked and adds no verifier.
    logprob_only = ROUTE.model_copy(update={"escalation": ROUTE.escalation.model_copy(
        update={"on_answer": AnswerCheck(min_mean_logprob=-1.0)})})
    tiers, why = cascade.tiers_for(logprob_only, hosted, 0.3, what_if=False)
    assert [t.p_esc for t in tiers] == [0.3, 0.0, 0.0] and "hosted" in why["standard"]
    assert all(t.grader is None for t in tiers)


@pytest.mark.parametrize("raw", ["1.5", "-0.1", "nan", "lots"])
def test_an_escalation_rate_outside_0_1_is_refused_naming_the_flag(raw: str) -> None:
    with pytest.raises(ValueError, match=r"--answer-escalation-rate .* such as 0\.15"):
        cascade.parse_rate(raw)
    assert cascade.parse_rate("0") == 0.0 and cascade.parse_rate("1") == 1.0


def test_the_rate_comes_from_the_measurement_then_the_flag_then_zero() -> None:
    live = ROUTE.model_copy(update={"escalation": ROUTE.escalation.model_copy(
        update={"on_answer": AnswerCheck(min_mean_logprob=-1.0)})})
    assert cascade.resolve_rate(live, 0.07, "the window", 0.5) == (0.07, False, "the window")
    assert cascade.resolve_rate(live, None, "", 0.5)[:2] == (0.5, False)
    p, what_if, why = cascade.resolve_rate(ROUTE, None, "", 0.5)
    assert (p, what_if) == (0.5, True) and "what-if" in why
    assert cascade.resolve_rate(ROUTE, None, "", None)[0] == 0.0
    assert "not configured" in cascade.resolve_rate(ROUTE, None, "", None)[2]
    assert "configured but nothing measured" in cascade.resolve_rate(live, None, "", None)[2]


def test_only_tiers_the_router_checks_get_the_rate() -> None:
    tiers, why = cascade.tiers_for(ROUTE, UPSTREAMS, 0.3, what_if=True)
    assert [t.p_esc for t in tiers] == [0.3, 0.3, 0.0]  # two vllm tiers; the last has nothing above it
    hosted = {**UPSTREAMS, "llama-70b": UPSTREAMS["openai-gpt4o"].model_copy(update={"name": "llama-70b"})}
    tiers, why = cascade.tiers_for(ROUTE, hosted, 0.3, what_if=True)
    assert [t.p_esc for t in tiers] == [0.3, 0.0, 0.0] and "hosted" in why["standard"]
    _, why = cascade.tiers_for(ROUTE, UPSTREAMS, None, what_if=False)
    assert why == {"simple": "escalation.on_answer is not configured", "standard": why["standard"]}


def test_the_window_rate_is_answers_replaced_over_answers_the_checked_tiers_gave() -> None:
    live = ROUTE.model_copy(update={"escalation": ROUTE.escalation.model_copy(
        update={"on_answer": AnswerCheck(min_mean_logprob=-1.0)})})
    c = Counters(requests={("adaptive", "simple", "llama-8b", "ok"): 800,
                           ("adaptive", "standard", "llama-70b", "ok"): 100,
                           ("adaptive", "complex", "openai-gpt4o", "ok"): 100,
                           ("adaptive", "simple", "llama-8b", "error_502"): 5},
                 prompt_tokens={"llama-8b": 800_000, "llama-70b": 100_000, "openai-gpt4o": 100_000},
                 completion_tokens={"llama-8b": 400_000, "llama-70b": 50_000, "openai-gpt4o": 50_000},
                 escalations={("adaptive", "low_answer_confidence"): 100, ("adaptive", "low_confidence"): 40})
    rep = window_cascade(live, UPSTREAMS, c, rate=0.9)  # the measurement wins over the flag
    assert rep["tiers"][0]["p_esc"] == pytest.approx(100 / 1000)  # 100 replaced / (900 kept + 100 replaced)
    assert rep["p_esc_source"].startswith("the window") and "pooled" in rep["p_esc_source"]
    assert window_cascade(ROUTE, UPSTREAMS, c, rate=0.2)["tiers"][0]["p_esc"] == 0.2  # unchecked: the what-if


def test_the_window_rate_counts_answers_replaced_by_either_check() -> None:
    c = Counters(requests={("adaptive", "simple", "llama-8b", "ok"): 800,
                           ("adaptive", "standard", "llama-70b", "ok"): 100,
                           ("adaptive", "complex", "openai-gpt4o", "ok"): 100},
                 prompt_tokens={"llama-8b": 800_000, "llama-70b": 100_000, "openai-gpt4o": 100_000},
                 completion_tokens={"llama-8b": 400_000, "llama-70b": 50_000, "openai-gpt4o": 50_000},
                 escalations={("adaptive", "low_answer_confidence"): 60, ("adaptive", "low_answer_score"): 40})
    rep = window_cascade(with_verifier(ROUTE, logprob=-1.0), UPSTREAMS, c, rate=None)
    assert rep["tiers"][0]["p_esc"] == pytest.approx(100 / 1000)  # (60 + 40) / (900 kept + 100 replaced)
    assert "low_answer_confidence 60" in rep["p_esc_source"] and "low_answer_score 40" in rep["p_esc_source"]
    assert rep["verifier"]["graders"] == {"openai-gpt4o": ["simple", "standard"]} and rep["verifier"]["dollars"] > 0
