"""Windows, rates and verdicts over every kind of run outcome (QA2 #5, #6, #16): all succeed, some fail,
all fail, all cancelled, too few, mostly cut at the drain. A failure ends a request as much as a success
does, so it never shrinks the window the rates divide by; anything judged on too little data is
INCONCLUSIVE, never PASS."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oculis_measure.bench.stats import (
    RequestResult,
    Tolerances,
    check_slos,
    measured_window,
    parse_slos,
    summarize,
    verdict,
)
from oculis_measure.figures import Absent, known

WARMUP, DURATION = 1.0, 8.0
FP = {"profile": "chat", "dataset_hash": "sha256:a", "seed": 42, "route": "r", "duration_s": DURATION,
      "warmup_s": WARMUP, "load": {"rate": 2.0, "burstiness": 1.0}, "salted": True}


def req(i: int, sent: float, outcome: str, took: float = 0.5) -> RequestResult:
    """outcome: ok, failed (HTTP 429 after `took`), cancelled (cut at the drain, at `took` after sending)."""
    r = RequestResult(i, sent, warmup=sent < WARMUP, ended_s=sent + took)
    if outcome == "ok":
        r.ok, r.ttft_s, r.e2e_s, r.output_tokens = True, 0.1, took, 10
    elif outcome == "failed":
        r.error = "http_429"
    else:
        r.cancelled = True
    return r


def run(*outcomes: tuple[int, str], took: float = 0.5) -> list[RequestResult]:
    """Requests sent evenly over the measured duration, `n` of each outcome in turn."""
    kinds = [kind for n, kind in outcomes for _ in range(n)]
    return [req(i, WARMUP + DURATION * i / len(kinds), kind, took) for i, kind in enumerate(kinds)]


@dataclass(frozen=True)
class Case:
    name: str
    results: list[RequestResult]
    window_s: float
    requests_per_s: float
    error_rate: float | None  # None: no request ended, so there is no error rate
    verdict_with_slo: str | None
    verdict_without: str | None


CASES = [
    Case("all_succeed", run((40, "ok")), 8.3, 40 / 8.3, 0.0, "PASS", None),
    # QA2 #5: 2 succeeded in an 8 s run are 0.25 req/s, however fast the 14 failures came back
    Case("some_fail", run((2, "ok"), (14, "failed"), took=0.01), 8.0, 2 / 8.0, 14 / 16, "INCONCLUSIVE", None),
    Case("all_fail", run((16, "failed"), took=0.01), 8.0, 0.0, 1.0, "INCONCLUSIVE", "INCONCLUSIVE"),
    # cut at the drain timeout (2 s after the planned end): the run lasted until the cut
    Case("all_cancelled", [req(i, WARMUP + i, "cancelled", took=WARMUP + DURATION + 2 - (WARMUP + i))
                           for i in range(8)], 10.0, 0.0, None, "INCONCLUSIVE", "INCONCLUSIVE"),
    # QA2 #6a: a p95 over 3 samples is no verdict
    Case("too_few", run((3, "ok")), 8.0, 3 / 8.0, 0.0, "INCONCLUSIVE", None),
    # QA2 #6b: the 18 slowest were cut at the drain; the 30 fast ones alone would pass. The last request was
    # sent 8 * 47/48 s after the warm-up and ended 3 s later: the window reaches that end. The cut ones were
    # in flight 3 s, a lower bound of their TTFT: the p95 is at least 3 s and the SLO is certainly missed
    # (issue 31: figures that are optimistic and still fail are a FAIL); with nothing to judge, too much cut.
    Case("mostly_cut", run((30, "ok"), (18, "cancelled"), took=3.0), DURATION * 47 / 48 + 3.0,
         30 / (DURATION * 47 / 48 + 3.0), 0.0, "FAIL", "INCONCLUSIVE"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_windows_and_denominators_and_verdicts_on_too_little_data(case: Case) -> None:
    win = measured_window(case.results, WARMUP, DURATION)
    assert win["window_s"] == pytest.approx(case.window_s)
    m = summarize(case.results, win["window_s"], slos=parse_slos("ttft_p95<1s"))
    assert m["duration_s"] == pytest.approx(case.window_s)
    assert m["requests_per_s"] == pytest.approx(case.requests_per_s)
    assert m["goodput_rps"] <= m["requests_per_s"] + 1e-12  # never more good requests than succeeded ones
    assert (m["error_rate"] if known(m["error_rate"]) else None) == (
        None if case.error_rate is None else pytest.approx(case.error_rate))
    tol = Tolerances()
    slos = check_slos(m, parse_slos("ttft_p95<1s"))
    assert verdict(m, FP, slos, None, None, None, tol)[0] == case.verdict_with_slo
    assert verdict(m, FP, [], None, None, None, tol)[0] == case.verdict_without


def test_a_missed_slo_fails_even_on_few_samples() -> None:
    m = summarize(run((3, "ok")), DURATION, slos=[])
    v, reasons = verdict(m, FP, check_slos(m, parse_slos("ttft_p95<50ms")), None, None, None, Tolerances())
    assert v == "FAIL" and reasons[0] == "SLO ttft_p95<50ms missed: observed 100.0ms"


outcome = st.sampled_from(["ok", "failed", "cancelled"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, WARMUP + DURATION), outcome, st.floats(0.001, 20)), max_size=60))
def test_any_run_outcomes_keep_the_window_rates_and_verdict_honest(spec: list[tuple[float, str, float]]) -> None:
    results = [req(i, sent, kind, took) for i, (sent, kind, took) in enumerate(spec)]
    win = measured_window(results, WARMUP, DURATION)
    assert win["window_s"] >= DURATION and win["drain_s"] >= 0
    m = summarize(results, win["window_s"], slos=parse_slos("ttft_p95<1s"))
    n = m["requests"]
    assert n["succeeded"] + n["failed"] + n["cancelled"] == n["measured"]
    assert m["requests_per_s"] * win["window_s"] == pytest.approx(n["succeeded"])
    if n["succeeded"] + n["failed"]:
        assert 0.0 <= m["error_rate"] <= 1.0
    else:  # a share over no ended request does not exist (figures.py): never 0 %
        assert isinstance(m["error_rate"], Absent)
    v, _ = verdict(m, FP, check_slos(m, parse_slos("ttft_p95<1s")), None, None, None, Tolerances())
    too_little = n["succeeded"] < 20 or (n["measured"] and n["cancelled"] / n["measured"] > 0.05)
    if too_little:
        assert v != "PASS"
    if n["succeeded"] == 0:
        assert verdict(m, FP, [], None, None, None, Tolerances())[0] == "INCONCLUSIVE"
