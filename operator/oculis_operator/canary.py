"""Canary analysis of an engine change: samples -> decision. Pure.

Every interval the shell reads, over that interval, the canary pods' and the stable pods' serving
figures from vLLM's own metrics (`queries`); `analyze` turns them into Promote / Rollback / Continue /
Inconclusive with the figures that made the decision. Argo Rollouts' table, fail-closed: a check
without samples, or with fewer finished requests than `minRequests`, fails; it never passes. A canary
that has seen no request at all is not judged (it waits for traffic) until `duration` has passed, and
then is Inconclusive, which rolls back like a failure: nothing unmeasured is ever promoted.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from oculis.formats import duration_seconds
from oculis.rollout import Canary, CanaryChecks

Verdict = Literal["Promote", "Rollback", "Continue", "Inconclusive"]
# The checks in order: (status name, short name for the CANARY column, CanaryChecks field, is a latency).
CHECKS = (("ttftP95Ms", "ttft", "ttft_p95_ms", True), ("itlP95Ms", "itl", "itl_p95_ms", True),
          ("e2eP95Ms", "e2e", "e2e_p95_ms", True), ("preemptionsPerMinute", "preempt", "preemptions_per_minute", False),
          ("errorRate", "errors", "error_rate", False))
# With no check configured at all the latencies are compared with the stable pods at this regression.
DEFAULT_REGRESSION_PERCENT = 10.0


@dataclass(frozen=True)
class Sample:
    """One track's (canary or stable) figures over one interval; None where the metric had no samples."""

    requests: float | None = None  # finished requests
    ttft_p95_ms: float | None = None
    itl_p95_ms: float | None = None
    e2e_p95_ms: float | None = None
    preemptions_per_minute: float | None = None
    error_rate: float | None = None

    def value(self, attr: str) -> float | None:
        v: float | None = getattr(self, attr)
        return None if v is None or math.isnan(v) else v


@dataclass(frozen=True)
class Check:
    name: str
    short: str
    canary: float | None
    stable: float | None
    limit: float | None
    ok: bool
    message: str = ""

    def as_status(self) -> dict[str, object]:
        return {"name": self.name, "canary": _round(self.canary), "stable": _round(self.stable),
                "limit": _round(self.limit), "ok": self.ok, "message": self.message}


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    checks: list[Check] = field(default_factory=list)
    failed_intervals: int = 0
    message: str = ""


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def active_checks(checks: CanaryChecks) -> list[tuple[str, str, str, bool]]:
    """The configured checks; none configured: the latencies against the stable pods."""
    chosen = [c for c in CHECKS if getattr(checks, c[2]) is not None
              or (c[3] and checks.max_regression_percent is not None)]
    return chosen or [c for c in CHECKS if c[3]]


def evaluate(checks: CanaryChecks, canary: Sample, stable: Sample | None, min_requests: int) -> list[Check]:
    """Each configured check of one interval: the canary's figure against its ceiling and, for a
    latency, against the stable figure plus maxRegressionPercent."""
    configured = any(getattr(checks, c[2]) is not None for c in CHECKS) or checks.max_regression_percent is not None
    regression = checks.max_regression_percent if configured else DEFAULT_REGRESSION_PERCENT
    requests = canary.requests or 0.0
    out = []
    for name, short, attr, latency in active_checks(checks):
        mine = canary.value(attr)
        theirs = stable.value(attr) if stable is not None else None
        ceiling: float | None = getattr(checks, attr)
        limits = [ceiling] if ceiling is not None else []
        relative = latency and regression is not None
        if relative and theirs is not None and regression is not None:
            limits.append(theirs * (1 + regression / 100))
        limit = min(limits) if limits else None
        if requests < min_requests:
            out.append(Check(name, short, mine, theirs, limit, False,
                             f"too few samples: {requests:g} canary requests, at least {min_requests} needed"))
        elif mine is None:
            out.append(Check(name, short, None, theirs, limit, False, "no canary samples"))
        elif relative and theirs is None:
            out.append(Check(name, short, mine, None, limit, False, "no stable samples to compare with"))
        elif limit is not None and mine > limit:
            why = (f"canary {mine:.4g} > limit {limit:.4g}" + (f" (stable {theirs:.4g} + {regression:g} %)"
                                                                   if relative and theirs is not None else ""))
            out.append(Check(name, short, mine, theirs, limit, False, why))
        else:
            out.append(Check(name, short, mine, theirs, limit, True))
    return out


def analyze(policy: Canary, canary: Sample | None, stable: Sample | None, elapsed_s: float,
            failed_before: int) -> Decision:
    """The decision after one interval. `elapsed_s`: since the canary replicas started;
    `failed_before`: intervals that failed so far."""
    duration = duration_seconds(policy.duration)
    seen = canary if canary is not None else Sample()
    if not seen.requests:  # no request reached the canary: nothing to judge, and never a pass
        if elapsed_s >= duration:
            checks = evaluate(policy.checks, seen, stable, policy.min_requests)
            return Decision("Inconclusive", checks, failed_before,
                            f"no request reached the canary in {policy.duration}: nothing measured, so not promoted")
        return Decision("Continue", [], failed_before, "waiting for traffic to reach the canary")
    checks = evaluate(policy.checks, seen, stable, policy.min_requests)
    failed = failed_before + (0 if all(c.ok for c in checks) else 1)
    bad = "; ".join(f"{c.name}: {c.message}" for c in checks if not c.ok)
    if failed > policy.failure_limit:
        return Decision("Rollback", checks, failed, f"{failed} failed interval(s), more than failureLimit "
                        f"{policy.failure_limit}: {bad or 'earlier intervals failed'}")
    if elapsed_s >= duration:
        if not all(c.ok for c in checks):  # the last interval must pass: never promote on a failing one
            return Decision("Continue", checks, failed, f"failed interval within failureLimit: {bad}")
        return Decision("Promote", checks, failed, f"every check passed after {policy.duration} "
                        f"({failed} failed interval(s), failureLimit {policy.failure_limit})")
    return Decision("Continue", checks, failed, bad and f"failed interval within failureLimit: {bad}")


def summary(intervals: int, total: int, checks: list[Check], verdict: str | None = None) -> str:
    """The CANARY column: `3/10 ttft ok itl ok`, the verdict once decided."""
    parts = [f"{intervals}/{total}"] + [f"{c.short} {'ok' if c.ok else 'FAIL'}" for c in checks]
    if verdict in ("Promote", "Rollback", "Inconclusive"):
        parts.append({"Promote": "promoted", "Rollback": "rolled back", "Inconclusive": "inconclusive"}[verdict])
    return " ".join(parts)


def intervals_total(policy: Canary) -> int:
    return max(1, math.ceil(duration_seconds(policy.duration) / duration_seconds(policy.interval)))


# ------------------------------------------------------------------ PromQL over vLLM's own metrics

def pod_pattern(name: str, track: Literal["canary", "stable"]) -> str:
    """Pods of the stable Deployment are `<name>-vllm-<rs>-<id>`, the canary's `<name>-vllm-canary-<rs>-<id>`
    (Prometheus regexes are anchored, so one never matches the other)."""
    # No re.escape: an upstream name is a DNS-1035 label (letters, digits, '-'), and PromQL strings
    # refuse the `\-` it would write.
    base = f"{name}-vllm"
    return f"{base}-canary-[a-z0-9]+-[a-z0-9]+" if track == "canary" else f"{base}-[a-z0-9]+-[a-z0-9]+"


def queries(namespace: str, name: str, track: Literal["canary", "stable"], window_s: int) -> dict[str, str]:
    """Sample field -> PromQL instant query over the last `window_s` seconds."""
    sel = f'namespace="{namespace}",pod=~"{pod_pattern(name, track)}"'
    w = f"[{window_s}s]"

    def p95(metric: str) -> str:
        return f"1000 * histogram_quantile(0.95, sum by (le) (rate({metric}_bucket{{{sel}}}{w})))"
    finished = f"sum(increase(vllm:request_success_total{{{sel}}}{w}))"
    return {
        "requests": finished,
        "ttft_p95_ms": p95("vllm:time_to_first_token_seconds"),
        "itl_p95_ms": p95("vllm:inter_token_latency_seconds"),
        "e2e_p95_ms": p95("vllm:e2e_request_latency_seconds"),
        "preemptions_per_minute": f"60 * sum(rate(vllm:num_preemptions_total{{{sel}}}{w}))",
        "error_rate": (f'sum(increase(vllm:request_success_total{{{sel},finished_reason=~"abort|error"}}{w})) '
                       f"/ {finished}"),
    }


def sample(values: dict[str, float | None]) -> Sample | None:
    """A Sample from the queries' answers; None when nothing came back at all (Prometheus unreachable)."""
    if all(v is None for v in values.values()):
        return None
    return Sample(**{k: (None if v is None or math.isnan(v) or math.isinf(v) else v) for k, v in values.items()})


def due(status: Mapping[str, object], policy: Canary, now: str) -> bool:
    """Whether an interval has passed since the analysis started or was last checked (status.canary)."""
    if status.get("phase") != "Analyzing" or not status.get("startedAt"):
        return False
    since = str(status.get("lastCheckAt") or status.get("startedAt"))
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        gap = (datetime.datetime.strptime(now, fmt) - datetime.datetime.strptime(since, fmt)).total_seconds()
    except ValueError:
        return True  # an unreadable time: check now rather than never
    return gap >= duration_seconds(policy.interval)
