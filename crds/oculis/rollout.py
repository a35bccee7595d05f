"""How a GPUUpstream's engine changes roll out: Auto, Manual (surge and unavailability) or a Canary
analysed on the engines' own metrics.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from oculis.base import Model
from oculis.formats import DURATION


class CanaryChecks(Model):
    """What the canary must meet, per interval, from vLLM's own metrics: absolute ceilings and a
    ceiling relative to the stable pods. Every unset check is skipped; no check at all compares the
    latencies with maxRegressionPercent 10."""

    ttft_p95_ms: float | None = Field(None, gt=0, description="Ceiling on the canary's p95 time to first token (ms)")
    itl_p95_ms: float | None = Field(None, gt=0, description="Ceiling on the canary's p95 inter-token latency (ms)")
    e2e_p95_ms: float | None = Field(None, gt=0, description="Ceiling on the canary's p95 end-to-end latency (ms)")
    preemptions_per_minute: float | None = Field(None, ge=0, description="Ceiling on the canary's preemptions "
                                                 "per minute")
    error_rate: float | None = Field(None, ge=0, le=1, description="Ceiling on the canary's share of aborted or "
                                     "failed requests")
    max_regression_percent: float | None = Field(None, ge=0, description="Each latency check also fails when the "
                                                 "canary is this many percent worse than the stable pods")


class Canary(Model):
    """Canary of an engine change: replicas with the new engine hash beside the stable ones, compared
    every interval; promoted after `duration` without too many failed intervals, else rolled back."""

    replicas: int = Field(1, ge=1, le=100)
    """Canary replicas (each needs a spare GPU set of the product)"""
    traffic_percent: int = Field(10, ge=1, le=99, description="Share of the upstream's requests the router "
                                 "sends to the canary (its own Service, <name>-vllm-canary) while it is analysed, "
                                 "whatever the replica counts; the stable Service serves only stable pods")
    duration: str = Field("10m", pattern=DURATION)
    """How long the analysis runs before promoting (e.g. 10m)"""
    interval: str = Field("1m", pattern=DURATION)
    """How often canary and stable are compared; also the metrics window (e.g. 1m)"""
    failure_limit: int = Field(1, ge=0)
    """Failed intervals tolerated; one more rolls back"""
    min_requests: int = Field(10, ge=1)
    """Finished canary requests an interval needs; fewer is a failed check, never a pass"""
    checks: CanaryChecks = Field(default_factory=CanaryChecks)
    """The checks each interval"""


class Rollout(Model):
    """How engine changes roll: Auto, Manual with explicit surge and unavailability, or Canary."""

    strategy: Literal["Auto", "Manual", "Canary"] = Field(
        "Auto", description="Auto: surge when a spare GPU of the product exists, else one at a time; Canary: "
        "first canary replicas compared with the stable ones on serving metrics, then Auto or rolled back"
    )
    canary: Canary | None = None
    """Canary: replicas, traffic share, duration, interval, failure limit and checks"""
    max_surge: int | None = Field(None, ge=0)
    """Manual: extra replicas during a rollout"""
    max_unavailable: int | None = Field(None, ge=0)
    """Manual: replicas that may be down during a rollout"""

    @model_validator(mode="after")
    def _can_progress(self) -> Rollout:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(ROLLOUT_STUCK)
        return self


ROLLOUT_STUCK = ("maxSurge and maxUnavailable cannot both be 0 (no replica could ever be replaced); "
                 "set maxUnavailable: 1, or maxSurge: 1 if a spare GPU exists")
