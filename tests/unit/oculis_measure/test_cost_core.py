"""`oculis cost report`: attribution of the router's per-upstream dollars to routes and tiers."""

from __future__ import annotations

import pytest

from oculis import Pricing
from oculis_measure.cost.core import Counters, GPUCost, cells, parse_group_by, report, unattributed_dollars

PRICES = {"small": Pricing(input_per_mtok=0.1, output_per_mtok=0.2),
          "gpt": Pricing(input_per_mtok=2.5, output_per_mtok=10, cached_input_per_mtok=1.25)}


def counters() -> Counters:
    return Counters(
        requests={("a", "cheap", "small", "ok"): 300, ("b", "cheap", "small", "ok"): 100,
                  ("a", "cheap", "small", "cache_hit"): 50, ("a", "strong", "gpt", "ok"): 40,
                  ("a", "strong", "gpt", "stream_broken"): 10, ("a", "-", "-", "error_429"): 5,
                  ("gpt", "direct", "gpt", "ok"): 50},
        prompt_tokens={"small": 40_000, "gpt": 100_000},
        completion_tokens={"small": 8_000, "gpt": 20_000},
        cached_tokens={"gpt": 60_000},
        cost={"small": 0.0056, "gpt": 0.375, "ghost": 0.01},
    )


def test_an_upstreams_dollars_are_shared_by_its_billed_requests_and_the_total_is_the_metric() -> None:
    cs = cells(counters(), PRICES)
    by = {(x.route, x.tier, x.upstream): x for x in cs}
    assert by[("a", "cheap", "small")].token_dollars == pytest.approx(0.0056 * 300 / 400)  # cache hits are free
    assert by[("b", "cheap", "small")].token_dollars == pytest.approx(0.0056 * 100 / 400)
    assert by[("a", "strong", "gpt")].token_dollars == pytest.approx(0.375 * 50 / 100)  # stream_broken is billed
    assert by[("gpt", "direct", "gpt")].token_dollars == pytest.approx(0.375 * 50 / 100)
    rep = report(cs, ["route"], unattributed_dollars(counters(), cs), "w", False)
    assert rep["total"]["token_dollars"] == pytest.approx(sum(counters().cost.values()))
    assert rep["total"]["unattributed_dollars"] == pytest.approx(0.01)  # an upstream no request reached
    assert "exclude provider discounts and batch pricing" in rep["note"]


def test_cached_prompt_tokens_are_priced_as_a_saving() -> None:
    by = {(x.route, x.upstream): x for x in cells(counters(), PRICES)}
    assert by[("a", "gpt")].cached_tokens == pytest.approx(30_000)
    assert by[("a", "gpt")].cache_saving_dollars == pytest.approx(30_000 * (2.5 - 1.25) / 1e6)
    assert by[("a", "small")].cache_saving_dollars == 0  # no cached price: nothing saved


def test_self_hosted_gpu_hours_are_allocated_by_request_share() -> None:
    cs = cells(counters(), PRICES, {"small": GPUCost(2.0, 4)}, window_hours=24)
    rep = report(cs, ["route", "upstream"], 0.0, "w", True)
    rows = {(r["route"], r["upstream"]): r for r in rep["rows"]}
    assert rows[("a", "small")]["gpu_dollars"] == pytest.approx(2.0 * 4 * 24 * 0.75)
    assert rep["total"]["gpu_dollars"] == pytest.approx(2.0 * 4 * 24)
    assert rep["basis"]["gpu_dollars"].startswith("allocation")


def test_group_by_sums_rows_and_counts_requests_once() -> None:
    rep = report(cells(counters(), PRICES), ["route", "tier"], 0.0, "w", False)
    rows = {(r["route"], r["tier"]): r for r in rep["rows"]}
    assert rows[("a", "cheap")]["requests"] == 350 and rows[("a", "cheap")]["cache_hits"] == 50
    # per answered request: the 10 broken streams cost their tokens but answered nobody (QA3 Part 2 #8)
    assert rows[("a", "strong")]["dollars_per_1k_requests"] == pytest.approx(1000 * 0.1875 / 40)
    assert rep["total"]["requests"] == 550  # the 5 refused before a tier are not any tier's


@pytest.mark.parametrize(("raw", "says"), [("route,tenant", "no tenant label"), ("route,model", "group by"),
                                           ("", "group by")])
def test_group_by_refuses_what_the_metrics_cannot_split(raw: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_group_by(raw)
    assert parse_group_by("route, tier,route") == ["route", "tier"]


def test_gpu_hours_come_from_self_hosted_gpuupstreams_that_price_them() -> None:
    from oculis_cli.cost_sources import gpu_costs

    def gu(name: str, **spec: object) -> dict[str, object]:
        return {"metadata": {"name": name}, "spec": spec}

    got = gpu_costs([gu("a", provider="vllm", replicas=3, gpu={"count": 2}, pricing={"gpuHourDollars": 2.5}),
                     gu("b", provider="vllm", gpu={"count": 1}, pricing={"inputPerMtok": 1}),
                     gu("c", provider="openai", pricing={"gpuHourDollars": 9})])
    assert got == {"a": GPUCost(2.5, 6)}


def test_lora_adapters_get_their_own_exact_rows() -> None:
    from oculis_measure.cost.core import adapter_rows

    c = Counters(cost={"small": 0.01}, adapter_cost={("small", "sql"): 0.004, ("small", "support"): 0.001},
                 adapter_prompt_tokens={("small", "sql"): 30_000}, adapter_completion_tokens={("small", "sql"): 5_000})
    rows = adapter_rows(c)
    assert [(r["adapter"], r["token_dollars"], r["share_of_upstream_dollars"]) for r in rows] == [
        ("sql", 0.004, 0.4), ("support", 0.001, 0.1)]  # the other 50 %: the base model
    assert rows[0]["prompt_tokens"] == 30_000 and rows[1]["completion_tokens"] == 0
    assert adapter_rows(Counters()) == []


def test_the_cost_report_prints_the_adapters_table() -> None:
    import io

    from oculis_cli.cost import render
    from oculis_measure.cost.core import adapter_rows

    c = Counters(requests={("chat", "small", "small", "ok"): 10}, cost={"small": 0.01},
                 adapter_cost={("small", "sql"): 0.004}, adapter_prompt_tokens={("small", "sql"): 30_000})
    cs = cells(c, PRICES)
    rep = report(cs, ["route"], 0.0, "w", False) | {"prices_from": "test", "adapters": adapter_rows(c)}
    out = io.StringIO()
    render(rep, out)
    text = out.getvalue()
    assert "LoRA adapters" in text and "sql" in text and "40.0%" in text and "30,000" in text
    plain = io.StringIO()
    render(report(cs, ["route"], 0.0, "w", False) | {"prices_from": "test", "adapters": []}, plain)
    assert "LoRA adapters" not in plain.getvalue()  # no adapter counted: no table


def test_cost_report_adapter_rows_use_the_adapter_counters() -> None:
    """Q18: a `<upstream>/<adapter>` row takes the adapter's own counters (so it agrees with the adapters
    table), and the upstream's other rows share what is left by calls; hand-checked arithmetic."""
    from oculis_measure.cost.core import adapter_rows

    c = Counters(
        # 6 small `llama/ext` calls, a 94-call `llama/sql` burst, 100 calls of route chat (tier sql-tier asks for
        # adapter sql), 50 base-model calls on route chat's tier base, a verifier grading 10 chat answers on llama
        requests={("llama/ext", "direct", "llama", "ok"): 6, ("llama/sql", "direct", "llama", "ok"): 94,
                  ("chat", "sql-tier", "llama", "ok"): 100, ("chat", "base", "llama", "ok"): 50,
                  ("chat", "base", "llama", "cache_hit"): 7},
        gradings={("chat", "llama", "pass"): 10},
        prompt_tokens={"llama": 100_000}, completion_tokens={"llama": 20_000}, cached_tokens={"llama": 10_000},
        cost={"llama": 1.0},
        adapter_prompt_tokens={("llama", "ext"): 40, ("llama", "sql"): 60_000},
        adapter_completion_tokens={("llama", "ext"): 20, ("llama", "sql"): 12_000},
        adapter_cost={("llama", "ext"): 0.000092, ("llama", "sql"): 0.6},
    )
    cs = cells(c, {"llama": Pricing(input_per_mtok=1, output_per_mtok=2, cached_input_per_mtok=0.5)},
               tier_adapters={("chat", "sql-tier"): "sql"})
    by = {(x.route, x.tier): x for x in cs}
    ext = by[("llama/ext", "direct")]  # the only row of adapter ext: exactly its counters
    assert (ext.prompt_tokens, ext.completion_tokens, ext.token_dollars, ext.adapter) == (40, 20, 0.000092, "ext")
    # adapter sql: 94 + 100 calls share its 60,000 / 12,000 tokens and $0.60
    assert by[("llama/sql", "direct")].prompt_tokens == pytest.approx(60_000 * 94 / 194)
    assert by[("chat", "sql-tier")].token_dollars == pytest.approx(0.6 * 100 / 194)
    # the rest: 100,000 - 40 - 60,000 = 39,960 prompt tokens, 20,000 - 20 - 12,000 = 7,980 completion,
    # $1 - 0.000092 - 0.6 = $0.399908, shared by the 50 base calls and the 10 gradings
    base, grading = by[("chat", "base")], by[("chat", "(verifier)")]
    assert base.prompt_tokens == pytest.approx(39_960 * 50 / 60) and grading.prompt_tokens == pytest.approx(6_660)
    assert base.completion_tokens == pytest.approx(7_980 * 50 / 60)
    assert base.token_dollars == pytest.approx(0.399908 * 50 / 60) and base.adapter is None
    assert grading.token_dollars == pytest.approx(0.399908 * 10 / 60)
    # cached tokens (no per-adapter counter) follow the prompt tokens: ext 40 / 100,000 of 10,000
    assert ext.cached_tokens == pytest.approx(4) and base.cached_tokens == pytest.approx(3_330)
    assert sum(x.token_dollars for x in cs) == pytest.approx(1.0) and unattributed_dollars(c, cs) == 0
    # the two tables agree: the route rows of each adapter sum to its row in the adapters table
    rep = report(cs, ["route"], 0.0, "w", False)
    rows = {r["route"]: r for r in rep["rows"]}
    table = {a["adapter"]: a for a in adapter_rows(c)}
    assert rows["llama/ext"]["prompt_tokens"] == table["ext"]["prompt_tokens"] == 40
    assert rows["llama/ext"]["token_dollars"] == table["ext"]["token_dollars"] == 0.000092
    assert rows["llama/sql"]["token_dollars"] + 0.6 * 100 / 194 == pytest.approx(table["sql"]["token_dollars"])
    assert "own oculis_adapter_*_total" in rep["basis"]["token_dollars"]


def test_cost_report_adapter_rows_fall_back_to_call_share_without_adapter_counters() -> None:
    """A router without the adapter counters (or a window without them): every row shares by calls, as
    before; and an upstream whose only rows are an adapter's leaves the rest unattributed, not lost."""
    c = Counters(requests={("llama/ext", "direct", "llama", "ok"): 1, ("llama", "direct", "llama", "ok"): 3},
                 prompt_tokens={"llama": 400}, cost={"llama": 0.4})
    by = {x.route: x for x in cells(c, {})}
    assert by["llama/ext"].token_dollars == pytest.approx(0.1) and by["llama/ext"].adapter is None
    only = Counters(requests={("llama/ext", "direct", "llama", "ok"): 1}, cost={"llama": 0.4},
                    adapter_cost={("llama", "ext"): 0.1})
    cs = cells(only, {})
    assert cs[0].token_dollars == pytest.approx(0.1) and unattributed_dollars(only, cs) == pytest.approx(0.3)
