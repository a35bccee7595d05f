"""Attribution to the routed vs the final tier (QA2 #3, #11, #14): a replaced answer and its grading are
charged to the route and tier that caused them, the routed share is the tier the route sent requests to
(not the tier that answered), the cascade is not applied again on top of one the counters observed, GPU
dollars include idle upstreams and split by the calls shown, and the cache saving is net of the write
premium (the same figure cache advise prints)."""

from __future__ import annotations

import pytest

from oculis import Pricing, RouterConfig, parse_config
from oculis_measure.cache.advise import Multipliers, Observed, advise, pricing_saving
from oculis_measure.cost.core import IDLE, VERIFIER_TIER, Counters, GPUCost, cells, report, unattributed_dollars
from oculis_measure.route.window import table, window_cascade

CONFIG = """
oculis:
  upstreams:
    - {name: ok2, provider: vllm, base_url: "http://127.0.0.1:1/v1", model: ok2,
       pricing: {input_per_mtok: 10, output_per_mtok: 10}}
    - {name: highlp, provider: vllm, base_url: "http://127.0.0.1:1/v1", model: highlp,
       pricing: {input_per_mtok: 5, output_per_mtok: 5}}
    - {name: lowlp, provider: vllm, base_url: "http://127.0.0.1:1/v1", model: lowlp,
       pricing: {input_per_mtok: 1, output_per_mtok: 1}}
    - {name: judge3, provider: openai, base_url: "http://127.0.0.1:1/v1", model: judge3,
       pricing: {input_per_mtok: 3, output_per_mtok: 3}}
  routes:
    - name: budgetverif
      escalation: {enabled: true, on_low_confidence: false, on_answer: {verifier: {upstream: judge3, min_score: 7}}}
      tiers: [{name: small, match: {complexity_below: 0.99}, upstream: ok2}, {name: big, upstream: highlp}]
    - name: budget
      tiers: [{name: only, upstream: ok2}]
    - name: lp
      escalation: {enabled: true, on_low_confidence: false, on_answer: {min_mean_logprob: -1.0}}
      tiers: [{name: small, match: {complexity_below: 0.99}, upstream: lowlp}, {name: big, upstream: highlp}]
"""
CFG: RouterConfig = parse_config(CONFIG, "test")
UPSTREAMS = {u.name: u for u in CFG.upstreams}
PRICING = {u.name: u.pricing for u in CFG.upstreams}


def budgetverif() -> Counters:
    """3 requests routed to small (ok2, $0.0002 each), graded 3 by judge3 ($0.000045 each) and replaced by
    big (highlp, $0.000075 each); the route `budget` answered 13 on ok2 alone ($0.00015 each)."""
    return Counters(
        requests={("budgetverif", "big", "highlp", "ok"): 3, ("budget", "only", "ok2", "ok"): 13},
        routed={("budgetverif", "small", "ok2"): 3, ("budget", "only", "ok2"): 13},
        replaced={("budgetverif", "small", "ok2"): 3},
        gradings={("budgetverif", "judge3", "fail"): 3},
        escalations={("budgetverif", "low_answer_score"): 3},
        prompt_tokens={"ok2": 16 * 10, "highlp": 3 * 10, "judge3": 3 * 15},
        completion_tokens={"ok2": 16 * 5, "highlp": 3 * 5, "judge3": 0},
        cost={"ok2": 13 * 0.00015 + 3 * 0.0002, "highlp": 3 * 0.000075, "judge3": 3 * 0.000045},
    )


def test_attribution_routed_vs_final_charges_replaced_answers_and_gradings_to_their_route() -> None:
    c = budgetverif()
    cs = cells(c, PRICING)
    assert unattributed_dollars(c, cs) == 0  # the verifier's gradings belong to the route they graded
    rows = {r["route"]: r for r in report(cs, ["route"], 0.0, "w", False)["rows"]}
    ok2 = c.cost["ok2"]
    # ok2's dollars split by calls: budget's 13 answers, budgetverif's 3 replaced ones (not 13 of 13)
    assert rows["budget"]["token_dollars"] == pytest.approx(ok2 * 13 / 16)
    assert rows["budgetverif"]["token_dollars"] == pytest.approx(ok2 * 3 / 16 + 3 * 0.000075 + 3 * 0.000045)
    assert (rows["budgetverif"]["requests"], rows["budgetverif"]["calls"]) == (3, 3 + 3 + 3)
    by_cell = {(x.route, x.tier): x for x in cs}
    assert by_cell[("budgetverif", VERIFIER_TIER)].gradings == 3


def test_attribution_routed_vs_final_route_analyze_shows_the_routed_tier_and_what_the_route_cost() -> None:
    route = CFG.route("budgetverif")
    rep = table(route, budgetverif(), PRICING, 1800)
    tiers = {t["tier"]: t for t in rep["tiers"]}
    assert (tiers["small"]["routed_share"], tiers["small"]["requests"], tiers["small"]["replaced_answers"]) == (1, 0, 3)
    assert (tiers["big"]["routed_share"], tiers["big"]["requests"]) == (0, 3)
    assert tiers[VERIFIER_TIER]["gradings"] == 3 and tiers[VERIFIER_TIER]["upstream"] == "judge3"
    spent = budgetverif().cost["ok2"] * 3 / 16 + 3 * 0.000075 + 3 * 0.000045
    assert rep["total"]["cost"] == pytest.approx(spent)
    assert rep["saving"]["dollars"] < 0  # the cascade cost more than all-big: the table says so
    casc = window_cascade(route, UPSTREAMS, budgetverif(), None)
    small, big = casc["tiers"]
    assert (small["routed_share"], small["p_esc"], small["final_share"]) == (1.0, 1.0, 0.0)
    assert big["final_share"] == 1.0
    assert casc["observed"]["per_request"] == pytest.approx(spent / 3)
    assert casc["total"]["cascade_cost"] > casc["total"]["routed_only_cost"]  # the escalation costs, not +0 %
    # the gradings the window measured replace the estimate: the projection is close to what ran
    assert casc["verifier"]["dollars"] == pytest.approx(3 * 0.000045) and "measured" in casc["verifier"]["source"]
    assert casc["total"]["cascade_cost"] == pytest.approx(casc["observed"]["dollars"], rel=0.1)


def test_attribution_routed_vs_final_an_observed_cascade_is_not_applied_twice() -> None:
    # lp: 3 requests routed to small (lowlp); 2 answers doubted and replaced by big, 1 kept
    c = Counters(
        requests={("lp", "small", "lowlp", "ok"): 1, ("lp", "big", "highlp", "ok"): 2},
        routed={("lp", "small", "lowlp"): 3}, replaced={("lp", "small", "lowlp"): 2},
        escalations={("lp", "low_answer_confidence"): 2},
        prompt_tokens={"lowlp": 30, "highlp": 20}, completion_tokens={"lowlp": 15, "highlp": 10},
        cost={"lowlp": 45e-6, "highlp": 150e-6})
    casc = window_cascade(CFG.route("lp"), UPSTREAMS, c, None)
    small, big = casc["tiers"]
    assert small["routed_share"] == 1.0 and small["p_esc"] == pytest.approx(2 / 3, abs=1e-4)
    assert small["final_share"] == pytest.approx(1 / 3, abs=1e-4) and big["routed_share"] == 0.0
    # routed-only: 3 answers of lowlp; cascade: those plus 2 of highlp (what happened), not a second round
    assert casc["total"]["routed_only_cost"] == pytest.approx(45e-6, rel=0.01)
    assert casc["total"]["cascade_cost"] == pytest.approx(45e-6 + 150e-6, rel=0.01)
    assert casc["observed"]["dollars"] == pytest.approx(195e-6)


def test_gpu_dollars_include_idle_upstreams_and_split_by_the_calls_shown() -> None:
    c = Counters(requests={("chat", "simple", "small", "ok"): 5, ("chat", "hard", "small", "ok"): 4,
                           ("chat", "simple", "small", "cache_hit"): 3},
                 cost={"small": 0.0})
    gpu = {"small": GPUCost(2.5, 2), "big": GPUCost(4.0, 1)}
    cs = cells(c, {}, gpu, window_hours=1 / 6)
    rep = report(cs, ["route", "tier", "upstream"], 0.0, "w", True)
    by = {(r["route"], r["tier"], r["upstream"]): r for r in rep["rows"]}
    assert by[(IDLE, "-", "big")]["gpu_dollars"] == pytest.approx(4 / 6)  # paid whether busy or not
    simple, hard = by[("chat", "simple", "small")], by[("chat", "hard", "small")]
    assert (simple["calls"], hard["calls"]) == (5, 4)
    assert simple["gpu_dollars"] / hard["gpu_dollars"] == pytest.approx(5 / 4)  # as the calls column says
    assert rep["total"]["gpu_dollars"] == pytest.approx(2.5 * 2 / 6 + 4 / 6)


def test_one_net_cache_saving_in_cost_report_and_cache_advise() -> None:
    # 4 answers, each 100 tokens written and 300 read, at $3/Mtok input, $0.30 read, $3.75 write
    p = Pricing(input_per_mtok=3, output_per_mtok=15, cached_input_per_mtok=0.3, cache_write_per_mtok=3.75)
    c = Counters(requests={("r", "t", "claude", "ok"): 4}, prompt_tokens={"claude": 1600},
                 cached_tokens={"claude": 1200}, cache_write_tokens={"claude": 400}, cost={"claude": 0.01})
    (cell,) = cells(c, {"claude": p})
    net = 1200 * (3 - 0.3) / 1e6 - 400 * (3.75 - 3) / 1e6
    assert cell.cache_saving_dollars == pytest.approx(net)
    adv = advise("claude", Multipliers(1.25, 0.1, "pricing"), Observed(1600, 1200, 400), 3)
    assert adv["saving_dollars"] == pytest.approx(net, abs=1e-6) == pytest.approx(pricing_saving(p, 1200, 400))
