"""The cascade cost model (escalation on the answer) next to the routed-only cost: pure arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis import Pricing, load_config
from oculis.router import AnswerCheck
from oculis_cli import cascade
from oculis_cli.cascade import Request, Tier
from oculis_cli.cost_core import Counters
from oculis_cli.route_window_core import window_cascade
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
    assert "(unpriced)" in cascade.text(rep)
    gone = cascade.report([Tier("a", "up-a", CHEAP, 0.3), Tier("b", "missing", None)], [Request(0, 10, 10)], "t", "t")
    assert gone["unpriced"] == ["missing"] and gone["all_strongest"]["routed_only_saving_pct"] is None


def test_the_verifier_is_zero_and_says_why() -> None:
    rep = cascade.report(three(0.1, 0.1), [Request(0, 1000, 500)], "test", "test")
    assert rep["verifier"]["dollars"] == 0.0 and "no extra call" in rep["verifier"]["why"]
    assert "schema has no verifier" in rep["verifier"]["why"]


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
