"""`oculis route analyze --since`: the seed's per-tier table from counter deltas (pure core)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from oculis import load_config
from oculis_measure.cost.core import Counters
from oculis_measure.route.window import parse_duration, parse_time, table, window

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
CFG = load_config(SEED)
ROUTE = CFG.route("adaptive")  # simple -> llama-8b, standard -> llama-70b, complex -> openai-gpt4o
PRICING = {u.name: u.pricing for u in CFG.upstreams}
DAY = 86400.0


def seed_counters() -> Counters:
    return Counters(
        requests={("adaptive", "simple", "llama-8b", "ok"): 1000, ("adaptive", "simple", "llama-8b", "cache_hit"): 100,
                  ("adaptive", "standard", "llama-70b", "ok"): 300, ("adaptive", "complex", "openai-gpt4o", "ok"): 100,
                  ("adaptive", "-", "-", "error_400"): 7},
        prompt_tokens={"llama-8b": 500_000, "llama-70b": 600_000, "openai-gpt4o": 400_000},
        completion_tokens={"llama-8b": 200_000, "llama-70b": 150_000, "openai-gpt4o": 100_000},
        cached_tokens={"openai-gpt4o": 100_000},
        cost={"llama-8b": 0.5 * 0.05 + 0.2 * 0.08, "llama-70b": 0.6 * 0.35 + 0.15 * 0.40,
              "openai-gpt4o": 0.3 * 2.5 + 0.1 * 1.25 + 0.1 * 10},
        escalations={("adaptive", "low_confidence"): 30, ("adaptive", "upstream_error"): 2},
    )


def test_tier_cost_is_requests_times_average_and_sums_to_the_cost_metric() -> None:
    rep = table(ROUTE, seed_counters(), PRICING, 7 * DAY)
    tiers = {t["tier"]: t for t in rep["tiers"]}
    assert [t["tier"] for t in rep["tiers"]] == ["simple", "standard", "complex"]
    assert tiers["simple"]["requests"] == 1100  # cache hits are requests the tier answered, at $0
    assert tiers["simple"]["cost"] == pytest.approx(0.041)
    for t in rep["tiers"]:
        assert t["requests"] * t["avg_cost"] == pytest.approx(t["cost"], rel=1e-6)
    assert rep["total"]["cost"] == pytest.approx(sum(seed_counters().cost.values()))
    assert rep["total"]["requests"] == 1500 and sum(t["share"] for t in rep["tiers"]) == pytest.approx(1)


@pytest.mark.parametrize(("days", "scale"), [(7, 30 / 7), (10, 3.0), (30, 1.0), (1, 30.0)])
def test_monthly_estimate_scales_the_window_to_30_days(days: int, scale: float) -> None:
    rep = table(ROUTE, seed_counters(), PRICING, days * DAY)
    assert rep["scale"] == pytest.approx(scale)
    for t in rep["tiers"]:
        assert t["est_monthly"] == pytest.approx(t["cost"] * scale, abs=0.005)
    assert f"{days:g} d" in rep["monthly_scaling"]


def test_baseline_reprices_each_requests_tokens_at_the_strongest_tiers_prices() -> None:
    rep = table(ROUTE, seed_counters(), PRICING, 7 * DAY)
    # every tier's real tokens at gpt-4o's prices (its cached tokens at the cached price)
    expected = ((0.5 * 2.5 + 0.2 * 10) + (0.6 * 2.5 + 0.15 * 10) + (0.3 * 2.5 + 0.1 * 1.25 + 0.1 * 10))
    assert rep["baseline"]["cost"] == pytest.approx(expected)
    naive = rep["tiers"][2]["avg_cost"] * rep["total"]["requests"]  # complex avg x all requests: not the rule
    assert rep["baseline"]["cost"] != pytest.approx(naive)
    assert rep["saving"]["dollars"] == pytest.approx(expected - rep["total"]["cost"])
    assert rep["saving"]["percent"] == pytest.approx(100 * (expected - rep["total"]["cost"]) / expected, abs=0.01)


def test_escalation_rate_states_its_denominator() -> None:
    esc = table(ROUTE, seed_counters(), PRICING, 7 * DAY)["escalation"]
    assert esc == {"escalated": 32, "of_requests": 1500, "rate": round(32 / 1500, 4),
                   "by_reason": {"low_confidence": 30, "upstream_error": 2}, "rule": esc["rule"]}
    assert "all requests" in esc["rule"]


def test_other_routes_and_direct_calls_on_a_shared_upstream_take_their_share() -> None:
    c = seed_counters()
    reqs = dict(c.requests)
    reqs[("other", "cheap", "llama-8b", "ok")] = 1000  # as many billed requests as adaptive's simple tier
    rep = table(ROUTE, replace(c, requests=reqs), PRICING, 7 * DAY)
    assert rep["tiers"][0]["cost"] == pytest.approx(0.041 / 2)


@pytest.mark.parametrize(("raw", "seconds"), [("7d", 7 * DAY), ("1h30m", 5400), ("90s", 90), ("2w", 14 * DAY),
                                              ("500ms", 0.5)])
def test_prometheus_durations(raw: str, seconds: float) -> None:
    assert parse_duration(raw).total_seconds() == seconds


@pytest.mark.parametrize("raw", ["7", "7days", "", "-1d", "0s", "1.5h", "d7"])
def test_bad_durations_name_the_units(raw: str) -> None:
    with pytest.raises(ValueError, match=r"duration|empty window"):
        parse_duration(raw)


def test_windows_from_since_or_from_to() -> None:
    now = datetime(2026, 12, 1, tzinfo=UTC)
    assert window("7d", None, None, now) == (now - timedelta(days=7), now)
    t0, t1 = window(None, "2026-11-24T00:00:00Z", "2026-11-25T00:00:00+01:00", now)
    assert (t1 - t0) == timedelta(hours=23)
    with pytest.raises(ValueError, match="not both"):
        window("7d", "2026-11-24T00:00:00Z", None, now)
    with pytest.raises(ValueError, match="not after"):
        window(None, "2026-11-25T00:00:00Z", "2026-11-24T00:00:00Z", now)
    with pytest.raises(ValueError, match="no time zone"):
        parse_time("2026-11-24T00:00:00", "--from")
    with pytest.raises(ValueError, match="--from 'yesterday' is not an RFC 3339"):
        parse_time("yesterday", "--from")


def test_the_seed_examples_monthly_figure_is_scaled_by_the_window_shown() -> None:
    # The design's example: simple 412,884 requests at $0.0002 = $82.58 in the window, printed with
    # `--since 7d` but est_monthly $247.73 (x 3, a 10-day window). With 7 days it is x 30/7.
    c = Counters(requests={("adaptive", "simple", "llama-8b", "ok"): 412_884}, cost={"llama-8b": 412_884 * 0.0002})
    simple = table(ROUTE, c, PRICING, 7 * DAY)["tiers"][0]
    assert round(simple["cost"], 2) == 82.58 and simple["avg_cost"] == pytest.approx(0.0002)
    assert round(simple["est_monthly"], 2) == 353.9 and round(simple["est_monthly"], 2) != 247.73
    assert round(table(ROUTE, c, PRICING, 10 * DAY)["tiers"][0]["est_monthly"], 2) == 247.73
