"""The canary analysis (samples -> Promote / Rollback / Continue / Inconclusive): every branch, fail-closed."""

from __future__ import annotations

import math

import pytest

from oculis.rollout import Canary, CanaryChecks
from oculis_operator import canary
from oculis_operator.canary import Sample, analyze, evaluate

GOOD = Sample(requests=50, ttft_p95_ms=100, itl_p95_ms=20, e2e_p95_ms=900, preemptions_per_minute=0, error_rate=0)
STABLE = Sample(requests=400, ttft_p95_ms=100, itl_p95_ms=20, e2e_p95_ms=900, preemptions_per_minute=0, error_rate=0)
SLOW = Sample(requests=50, ttft_p95_ms=800, itl_p95_ms=20, e2e_p95_ms=2000, preemptions_per_minute=0, error_rate=0)
POLICY = Canary(duration="60s", interval="10s", failure_limit=1, min_requests=10,
                checks=CanaryChecks(ttft_p95_ms=500, max_regression_percent=20))


def test_a_good_canary_continues_then_promotes_after_duration() -> None:
    mid = analyze(POLICY, GOOD, STABLE, elapsed_s=20, failed_before=0)
    assert mid.verdict == "Continue" and all(c.ok for c in mid.checks) and mid.failed_intervals == 0
    end = analyze(POLICY, GOOD, STABLE, elapsed_s=60, failed_before=0)
    assert end.verdict == "Promote" and "every check passed" in end.message


def test_regression_beyond_the_limit_rolls_back_past_the_failure_limit_with_the_figures() -> None:
    first = analyze(POLICY, SLOW, STABLE, elapsed_s=10, failed_before=0)
    assert first.verdict == "Continue" and first.failed_intervals == 1  # within failureLimit 1
    second = analyze(POLICY, SLOW, STABLE, elapsed_s=20, failed_before=1)
    assert second.verdict == "Rollback" and second.failed_intervals == 2
    ttft = next(c for c in second.checks if c.name == "ttftP95Ms")
    # the lower of the ceiling (500) and stable + 20 % (120) is the limit
    assert (ttft.canary, ttft.stable, ttft.limit, ttft.ok) == (800, 100, 120, False)
    assert "canary 800 > limit 120" in second.message


def test_failure_limit_zero_rolls_back_on_the_first_failed_interval() -> None:
    strict = POLICY.model_copy(update={"failure_limit": 0})
    assert analyze(strict, SLOW, STABLE, elapsed_s=10, failed_before=0).verdict == "Rollback"


def test_a_failing_last_interval_within_the_limit_never_promotes() -> None:
    d = analyze(POLICY, SLOW, STABLE, elapsed_s=60, failed_before=0)
    assert d.verdict == "Continue" and d.failed_intervals == 1


@pytest.mark.parametrize("canary_sample", [Sample(requests=3, ttft_p95_ms=50), Sample(requests=50, ttft_p95_ms=None),
                                           Sample(requests=50, ttft_p95_ms=math.nan)])
def test_too_few_or_missing_samples_fail_the_check_never_pass(canary_sample: Sample) -> None:
    checks = evaluate(POLICY.checks, canary_sample, STABLE, POLICY.min_requests)
    assert checks and not any(c.ok for c in checks)
    assert analyze(POLICY, canary_sample, STABLE, elapsed_s=60, failed_before=1).verdict == "Rollback"


def test_missing_stable_samples_fail_a_relative_check() -> None:
    checks = evaluate(POLICY.checks, GOOD, None, POLICY.min_requests)
    ttft = next(c for c in checks if c.name == "ttftP95Ms")
    assert not ttft.ok and "no stable samples" in ttft.message
    # an absolute ceiling alone needs no stable figure
    absolute = CanaryChecks(preemptions_per_minute=5)
    assert [(c.name, c.ok) for c in evaluate(absolute, GOOD, None, 10)] == [("preemptionsPerMinute", True)]


def test_no_traffic_waits_then_is_inconclusive_after_duration() -> None:
    assert analyze(POLICY, Sample(requests=0), STABLE, elapsed_s=30, failed_before=0).verdict == "Continue"
    assert analyze(POLICY, None, None, elapsed_s=30, failed_before=0).verdict == "Continue"
    late = analyze(POLICY, None, None, elapsed_s=60, failed_before=0)
    assert late.verdict == "Inconclusive" and "not promoted" in late.message
    assert late.checks and not any(c.ok for c in late.checks)


def test_without_configured_checks_latencies_are_compared_with_stable_at_ten_percent() -> None:
    bare = Canary(duration="10s", interval="10s")
    checks = evaluate(bare.checks, SLOW, STABLE, 10)
    assert [c.name for c in checks] == ["ttftP95Ms", "itlP95Ms", "e2eP95Ms"]
    ttft = checks[0]
    assert ttft.limit == pytest.approx(110) and not ttft.ok
    assert [c.ok for c in evaluate(bare.checks, GOOD, STABLE, 10)] == [True, True, True]


def test_error_rate_and_preemption_ceilings() -> None:
    checks = CanaryChecks(error_rate=0.01, preemptions_per_minute=2)
    bad = Sample(requests=50, error_rate=0.2, preemptions_per_minute=30)
    assert [(c.name, c.ok) for c in evaluate(checks, bad, STABLE, 10)] == [("preemptionsPerMinute", False),
                                                                          ("errorRate", False)]


def test_summary_column_and_intervals() -> None:
    d = analyze(POLICY, GOOD, STABLE, elapsed_s=20, failed_before=0)
    assert canary.summary(3, canary.intervals_total(POLICY), d.checks) == "3/6 ttft ok itl ok e2e ok"
    r = analyze(POLICY, SLOW, STABLE, elapsed_s=20, failed_before=1)
    assert canary.summary(2, 6, r.checks, r.verdict).endswith("ttft FAIL itl ok e2e FAIL rolled back")


def test_interval_due_only_after_an_interval_since_the_last_check() -> None:
    st = {"phase": "Analyzing", "startedAt": "2026-01-01T00:00:00Z"}
    assert not canary.due(st, POLICY, "2026-01-01T00:00:05Z")
    assert canary.due(st, POLICY, "2026-01-01T00:00:10Z")
    assert not canary.due({**st, "lastCheckAt": "2026-01-01T00:00:10Z"}, POLICY, "2026-01-01T00:00:15Z")
    assert not canary.due({"phase": "RolledBack", "startedAt": "2026-01-01T00:00:00Z"}, POLICY, "2026-01-02T00:00:00Z")
    assert not canary.due({"phase": "Analyzing"}, POLICY, "2026-01-02T00:00:00Z")  # not started yet


def test_queries_keep_canary_and_stable_pods_apart() -> None:
    import re

    c, s = canary.pod_pattern("llama", "canary"), canary.pod_pattern("llama", "stable")
    assert re.fullmatch(c, "llama-vllm-canary-5d9f7-abcde") and not re.fullmatch(s, "llama-vllm-canary-5d9f7-abcde")
    assert re.fullmatch(s, "llama-vllm-7c8d9-xyz12") and not re.fullmatch(c, "llama-vllm-7c8d9-xyz12")
    q = canary.queries("ns", "llama", "canary", 30)
    assert "vllm:time_to_first_token_seconds_bucket" in q["ttft_p95_ms"] and "[30s]" in q["requests"]
    assert canary.sample({k: None for k in q}) is None  # nothing answered: no sample, never a pass
    assert canary.sample({**{k: None for k in q}, "requests": 5.0}) == Sample(requests=5.0)
