"""`route analyze --since` and `cost report` count what their labels say (QA3 Part 2):
- #2: a route's `<route>/<adapter>` traffic (counted by the router under that label, while its routed count is
  under the route's name) was left out of the route's requests and cost: 10 routed, 5 requests, half the cost;
- #7: est_monthly was rounded to cents (0.0 for a non-zero cost, breaking the printed `cost x scale`), and a
  one-tier route's saving printed as `$-0.000000`;
- #8: "requests ... answered" counted 502s, 503s and broken streams, and `$/1k req` divided by them;
- #19: rows with nothing in the window (an adapter since removed, a routed count kept under another label)."""

from __future__ import annotations

import io

import pytest

from oculis import Pricing, Route
from oculis_cli import checks_output as out
from oculis_cli.cost import render as cost_render
from oculis_measure.cost.core import Counters, adapter_rows, cells, report
from oculis_measure.route.window import table

PRICING = {"llama-8b": Pricing(input_per_mtok=0.05, output_per_mtok=0.08)}
ROUTE = Route.model_validate({"name": "chat", "tiers": [{"name": "base", "upstream": "llama-8b"}]})
HOUR = 3600.0


def adapter_traffic() -> Counters:
    # what the router counts for 5 calls of `chat` and 5 of `chat/sql` (routed under `chat` for both)
    return Counters(
        requests={("chat", "base", "llama-8b", "ok"): 5, ("chat/sql", "base", "llama-8b", "ok"): 5},
        routed={("chat", "base", "llama-8b"): 10},
        prompt_tokens={"llama-8b": 200}, completion_tokens={"llama-8b": 100},
        cost={"llama-8b": 200 * 0.05e-6 + 100 * 0.08e-6},
        adapter_prompt_tokens={("llama-8b", "sql"): 100}, adapter_completion_tokens={("llama-8b", "sql"): 50},
        adapter_cost={("llama-8b", "sql"): 100 * 0.05e-6 + 50 * 0.08e-6})


def test_a_route_s_adapter_calls_are_its_requests_and_cost() -> None:
    c = adapter_traffic()
    rep = table(ROUTE, c, PRICING, HOUR)
    base = rep["tiers"][0]
    assert base["routed"] == 10 and base["requests"] == 10 and base["answered"] == 10
    assert base["cost"] == pytest.approx(c.cost["llama-8b"])
    assert rep["total"]["requests"] == 10


def test_est_monthly_is_the_window_cost_times_the_printed_scale_unrounded() -> None:
    tiny = Counters(requests={("chat", "base", "llama-8b", "ok"): 1}, cost={"llama-8b": 7.2e-07},
                    prompt_tokens={"llama-8b": 8}, completion_tokens={"llama-8b": 4})
    rep = table(ROUTE, tiny, PRICING, 2 * HOUR)
    t = rep["tiers"][0]
    assert rep["scale"] == 360 and t["est_monthly"] == pytest.approx(7.2e-07 * 360)  # was 0.0
    assert out.money(t["est_monthly"]) == "$0.000259"
    assert out.money(rep["saving"]["est_monthly"]) == "$0.000000" and out.money(-1e-12) == "$0.000000"


def test_requests_are_any_outcome_and_the_cost_per_request_is_per_answered_one() -> None:
    c = Counters(requests={("chat", "base", "llama-8b", "ok"): 3, ("chat", "base", "llama-8b", "error_503"): 4,
                           ("chat", "base", "llama-8b", "stream_broken"): 1},
                 prompt_tokens={"llama-8b": 300}, completion_tokens={"llama-8b": 30}, cost={"llama-8b": 2.16e-06})
    rep = report(cells(c, PRICING), ["route", "tier", "upstream"], 0.0, "w", False)
    row = rep["rows"][0]
    assert row["requests"] == 8 and row["answered"] == 3
    assert row["dollars_per_1k_requests"] == pytest.approx(1000 * 2.16e-06 / 3)  # was over 8
    text = io.StringIO()
    cost_render(rep | {"prices_from": "config", "adapters": []}, text)
    assert "any outcome" in text.getvalue() and "answered" in text.getvalue()
    window = table(ROUTE, c, PRICING, HOUR)
    assert window["tiers"][0]["requests"] == 8 and window["total"]["answered"] == 3


def test_rows_with_nothing_in_the_window_are_left_out() -> None:
    c = adapter_traffic()
    c = Counters(**{**c.__dict__, "routed": {("llama-8b", "direct", "llama-8b"): 5},
                    "adapter_cost": {**c.adapter_cost, ("llama-8b", "support"): 0.0},
                    "adapter_prompt_tokens": {**c.adapter_prompt_tokens, ("llama-8b", "support"): 0.0}})
    rep = report(cells(c, PRICING), ["route", "tier", "upstream"], 0.0, "w", False)
    assert [(r["route"], r["tier"]) for r in rep["rows"]] == [("chat", "base"), ("chat/sql", "base")]
    assert [a["adapter"] for a in adapter_rows(c)] == ["sql"]
