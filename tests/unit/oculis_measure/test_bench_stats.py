"""Benchmark arithmetic: SLO expressions, metrics from samples, direction-aware deltas and the verdict."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oculis_measure.bench.stats import (
    RequestResult,
    Tolerances,
    check_slos,
    delta,
    from_vllm,
    parse_slos,
    read_baseline,
    summarize,
    verdict,
)
from oculis_measure.figures import Absent
from oculis_measure.inputs import InputError

# ---- SLOs ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "parsed"), [
    ("ttft_p95<1500ms", [("ttft", "p95", "<", 1500.0)]),
    ("e2e_p99<=5s", [("e2e", "p99", "<=", 5000.0)]),
    ("tpot_mean<60ms, itl_p95 < 0.06s", [("tpot", "mean", "<", 60.0), ("itl", "p95", "<", 60.0)]),
    ("error_rate<1%", [("error_rate", None, "<", 0.01)]),
    ("goodput_share>=0.9", [("goodput_share", None, ">=", 0.9)]),
    ("throughput_tok_s>=500,cost_per_1k_requests<2.5", [("throughput_tok_s", None, ">=", 500.0),
                                                        ("cost_per_1k_requests", None, "<", 2.5)]),
])
def test_slo_expressions_parse_to_metric_stat_op_and_value_in_ms(text: str, parsed: list[tuple[Any, ...]]) -> None:
    assert [(s.metric, s.stat, s.op, s.value) for s in parse_slos(text)] == parsed


@pytest.mark.parametrize(("text", "says"), [
    ("ttft<1500ms", "say which statistic, e.g. ttft_p95<1500ms"),
    ("ttft_p95<1500", "a latency needs a unit, ms or s"),
    ("latency_p95<1s", "unknown metric 'latency_p95'"),
    ("ttft_p95~1s", "is not an SLO; write METRIC"),
    ("throughput_tok_s>5%", "throughput_tok_s is not a share"),
    ("error_rate<1ms", "error_rate is not a time"),
    (",", "is empty"),
])
def test_a_bad_slo_names_the_term_and_the_form(text: str, says: str) -> None:
    with pytest.raises(InputError, match="--slo") as err:
        parse_slos(text)
    assert says in str(err.value) and "\n" not in str(err.value)


# ---- metrics ---------------------------------------------------------------------------------------------

def ok(i: int, ttft: float, e2e: float, tokens: int, **kw: Any) -> RequestResult:
    gaps = [(e2e - ttft) / (tokens - 1)] * (tokens - 1) if tokens > 1 else []
    return RequestResult(index=i, sent_s=float(i), ok=True, ttft_s=ttft, e2e_s=e2e, output_tokens=tokens,
                         itl_s=gaps, **kw)


def test_metrics_use_vllm_formulas_and_numpy_percentiles() -> None:
    rs = [ok(i, 0.1 + 0.01 * i, 1.0 + 0.1 * i, 11) for i in range(20)]
    m = summarize(rs, 10.0)
    ttfts = np.array([0.1 + 0.01 * i for i in range(20)]) * 1000
    assert m["ttft_ms"]["p95"] == pytest.approx(float(np.percentile(ttfts, 95)))
    assert m["throughput_tok_s"] == pytest.approx(220 / 10) and m["requests_per_s"] == pytest.approx(2.0)
    # tpot = (e2e - ttft) / (tokens - 1) per request
    tpots = [((1.0 + 0.1 * i) - (0.1 + 0.01 * i)) / 10 * 1000 for i in range(20)]
    assert m["tpot_ms"]["p50"] == pytest.approx(float(np.percentile(tpots, 50)))
    assert m["e2e_ms"]["p99"] == pytest.approx(float(np.percentile([(1.0 + 0.1 * i) * 1000 for i in range(20)], 99)))


def test_warmup_is_excluded_and_a_one_token_answer_has_no_tpot() -> None:
    rs = [ok(0, 0.1, 0.1, 1), ok(1, 5.0, 9.0, 10, warmup=True)]
    m = summarize(rs, 1.0)
    assert m["requests"] == {"measured": 1, "succeeded": 1, "failed": 0, "cancelled": 0, "warmup_excluded": 1}
    assert isinstance(m["tpot_ms"], Absent) and m["ttft_ms"]["p50"] == pytest.approx(100)


def test_goodput_counts_errors_and_requests_cut_at_the_drain_as_missed() -> None:
    slos = parse_slos("ttft_p95<200ms,e2e_p99<=1s")
    rs = [ok(0, 0.1, 0.5, 5), ok(1, 0.3, 0.5, 5),  # good; ttft too slow
          ok(2, 0.1, 1.0, 5),  # e2e exactly 1 s meets <=
          RequestResult(3, 3.0, error="http_503"), RequestResult(4, 4.0, cancelled=True)]
    m = summarize(rs, 2.0, slos=slos)
    # 2 good of 3 succeeded + 1 failed + 1 cut: a run cannot look better by stalling more
    assert m["goodput_share"] == pytest.approx(2 / 5)
    assert m["goodput_rps"] == pytest.approx(1.0)
    assert m["errors"] == 1 and m["errors_by_kind"] == {"http_503": 1} and m["error_rate"] == pytest.approx(0.25)
    assert m["requests"]["cancelled"] == 1


def test_cost_per_1k_requests_is_the_mean_request_cost_times_1000_only_when_every_answer_is_priced() -> None:
    priced = [ok(i, 0.1, 0.2, 3, cost=0.002) for i in range(4)]
    assert summarize(priced, 1.0)["cost_per_1k_requests"] == pytest.approx(2.0)
    assert summarize([*priced, ok(9, 0.1, 0.2, 3)], 1.0)["cost_per_1k_requests"] is None


def test_slo_gates_check_the_aggregate_and_say_when_it_was_not_measured() -> None:
    m = summarize([ok(i, 0.1, 0.2, 1) for i in range(5)], 1.0)
    res = check_slos(m, parse_slos("ttft_p95<150ms,tpot_p95<10ms,error_rate<1%"))
    assert [r["met"] for r in res] == [True, None, True]


# ---- compare ---------------------------------------------------------------------------------------------

def metrics(tok: float, rps: float, ttft95: float, cost: float | None = None, err: float = 0.0,
            n: int = 100, simulated: bool = False) -> dict[str, Any]:
    return {"throughput_tok_s": tok, "requests_per_s": rps, "ttft_ms": {"p50": ttft95 / 2, "p95": ttft95},
            "cost_per_1k_requests": cost, "error_rate": err, "requests": {"succeeded": n}, "simulated": simulated}


def test_deltas_reproduce_the_design_examples_with_direction() -> None:
    # measure.md section 8: 412 -> 987 tok/s = +139.6 %, 8.2 -> 19.4 req/s = +136.6 %,
    # TTFT p95 2841 -> 1204 = -57.6 %, $14.02 -> $4.74 = -66.2 %
    d = delta(metrics(412, 8.2, 2841, 14.02), metrics(987, 19.4, 1204, 4.74), Tolerances())
    assert round(d["throughput_tok_s"]["change_pct"], 1) == 139.6
    assert round(d["requests_per_s"]["change_pct"], 1) == 136.6
    assert round(d["ttft_ms.p95"]["change_pct"], 1) == -57.6
    assert round(d["cost_per_1k_requests"]["change_pct"], 1) == -66.2
    assert {d[k]["status"] for k in d if k != "error_rate"} == {"improved"}  # better, whichever way is better


@pytest.mark.parametrize(("current", "key", "status"), [
    (metrics(500, 10, 100), "throughput_tok_s", "regressed"),  # halved throughput
    (metrics(950, 10, 100), "throughput_tok_s", "ok"),  # -5 %: inside the 10 % tolerance
    (metrics(1000, 10, 130), "ttft_ms.p95", "regressed"),  # +30 %, +30 ms
    (metrics(1000, 10, 70), "ttft_ms.p95", "improved"),
    (metrics(1000, 10, 95), "ttft_ms.p95", "ok"),  # -5 %: inside the limit, noise either way
    (metrics(1050, 10, 100), "throughput_tok_s", "ok"),
    (metrics(1000, 10, 100, err=0.02), "error_rate", "regressed"),  # +2 pp
    (metrics(1000, 10, 100, cost=1.2), "cost_per_1k_requests", "regressed"),
])
def test_a_regression_is_a_move_in_the_worse_direction_beyond_its_limit(current: dict[str, Any], key: str,
                                                                         status: str) -> None:
    d = delta(metrics(1000, 10, 100, cost=1.0), current, Tolerances())
    assert d[key]["status"] == status


def test_a_latency_rise_below_the_absolute_floor_is_noise() -> None:
    d = delta(metrics(1000, 10, 4), metrics(1000, 10, 8), Tolerances(latency_floor_ms=5))
    assert d["ttft_ms.p95"]["change_pct"] == pytest.approx(100) and d["ttft_ms.p95"]["status"] == "ok"


FP = {"profile": "mixed", "dataset_hash": "sha256:a", "seed": 42, "route": "r", "duration_s": 60.0,
      "warmup_s": 6.0, "load": {"rate": 2.0, "burstiness": 1.0}}


def judge(base: dict[str, Any] | None, cur: dict[str, Any], base_fp: dict[str, Any] | None = FP,
          slos: str | None = None) -> tuple[str | None, list[str]]:
    tol = Tolerances()
    d = delta(base, cur, tol) if base is not None else None
    return verdict(cur, FP, check_slos(cur, parse_slos(slos)) if slos else [], base, base_fp, d, tol)


def test_verdict_pass_fail_and_the_binding_reason_first() -> None:
    assert judge(metrics(1000, 10, 100), metrics(1000, 10, 100))[0] == "PASS"
    v, reasons = judge(metrics(1000, 10, 100), metrics(450, 4.5, 100))
    assert v == "FAIL" and reasons[0].startswith("throughput_tok_s 1,000.0 -> 450.0 (-55.0%), limit -10%")
    assert judge(None, metrics(1000, 10, 100)) == (None, ["no --compare and no --slo: nothing to judge"])
    v, reasons = judge(None, metrics(1000, 10, 100), slos="ttft_p95<50ms")
    assert v == "FAIL" and reasons == ["SLO ttft_p95<50ms missed: observed 100.0ms"]


@pytest.mark.parametrize(("base_fp", "cur", "says"), [
    ({**FP, "seed": 7}, metrics(1000, 10, 100), "workload mismatch: seed 7 vs 42"),
    ({**FP, "dataset_hash": "sha256:b"}, metrics(1000, 10, 100), "dataset_hash"),
    (None, metrics(1000, 10, 100), "no workload fingerprint"),
    (FP, metrics(1000, 10, 100, n=5), "the current run has 5 succeeded requests"),
    (FP, metrics(1000, 10, 100, simulated=True), "one run is simulated"),
])
def test_a_comparison_that_cannot_tell_is_inconclusive_even_when_the_numbers_regress(
        base_fp: dict[str, Any] | None, cur: dict[str, Any], says: str) -> None:
    v, reasons = judge(metrics(1000, 10, 100), cur, base_fp)
    assert v == "INCONCLUSIVE" and says in reasons[0]
    v, _ = judge(metrics(1000, 10, 100), {**cur, "throughput_tok_s": 100}, base_fp)
    assert v == "INCONCLUSIVE"


def test_a_vllm_save_result_file_is_a_baseline_in_the_same_names() -> None:
    raw = {"duration": 10.0, "completed": 98, "failed": 2, "request_throughput": 9.8, "output_throughput": 1234.5,
           "request_goodput": None, "median_ttft_ms": 40.0, "p99_ttft_ms": 90.0, "mean_ttft_ms": 45.0,
           "p99_e2el_ms": 900.0, "median_e2el_ms": 500.0}
    m, fp = read_baseline(raw, "vllm.json")
    assert fp is None and m == from_vllm(raw)
    assert m["throughput_tok_s"] == 1234.5 and m["ttft_ms"]["p50"] == 40.0 and m["ttft_ms"]["p99"] == 90.0
    assert m["e2e_ms"]["p99"] == 900.0 and m["error_rate"] == pytest.approx(0.02)
    with pytest.raises(InputError, match="neither an `oculis bench run --save` file"):
        read_baseline({"x": 1}, "x.json")


def test_a_vllm_baseline_cannot_say_it_was_simulated_so_only_the_fingerprint_blocks_it() -> None:
    raw = {"completed": 100, "failed": 0, "request_throughput": 10.0, "output_throughput": 1000.0,
           "p95_ttft_ms": 100.0, "median_ttft_ms": 50.0}
    base = from_vllm(raw)
    cur = metrics(1000, 10, 100, simulated=True)
    assert judge(base, cur, None)[0] == "INCONCLUSIVE"  # no fingerprint
    assert judge(base, cur, FP)[0] == "PASS"  # --force-compare vouches for the workload
