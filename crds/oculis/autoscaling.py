"""A GPUUpstream's autoscaling: replica bounds, per-replica targets and the stabilisation windows.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from oculis.base import Model
from oculis.formats import DURATION, DURATION_OR_ZERO


class AutoscalingTargets(Model):
    """What one replica should carry; the replicas asked for are the larger of the two, HPA style."""

    waiting_per_replica: float = Field(5, gt=0, le=10_000, description="Requests waiting in vLLM's queue "
                                       "(vllm:num_requests_waiting) per replica")
    kv_cache_usage: float = Field(0.8, gt=0, le=1, description="KV cache usage (vllm:kv_cache_usage_perc, 0-1) "
                                  "per replica")


class Autoscaling(Model):
    """Replicas follow demand: vLLM's queue and KV usage from Prometheus plus the router's demand for the
    upstream. The operator writes only the Deployment's replicas and status.autoscaling (never spec);
    missing, stale or partial metrics hold the count; it never asks for more replicas than the GPU pool
    can place. With minReplicas 0 an idle upstream goes to zero and the next routed request wakes it
    (the route's coldStart decides what that request gets meanwhile)."""

    min_replicas: int = Field(1, ge=0, le=1000)
    """Fewest replicas; 0 allows scale to zero"""
    max_replicas: int = Field(ge=1, le=1000)
    """Most replicas"""
    targets: AutoscalingTargets = Field(default_factory=AutoscalingTargets)
    """Per-replica targets"""
    scale_up_stabilization: str = Field("30s", pattern=DURATION_OR_ZERO, description="How long the load must "
                                        "ask for more before scaling up (to the lowest reading in that time)")
    max_scale_up_step: int | None = Field(None, ge=1, le=1000, description="Most replicas one scale-up adds (the "
                                          "next step waits until those are Ready); unset: as many as the load "
                                          "asks for, up to maxReplicas and what the GPU pool can place")
    scale_down_delay: str = Field("5m", pattern=DURATION_OR_ZERO, description="How long the load must ask for "
                                  "fewer before scaling down (to the highest reading in that time)")
    scale_to_zero_after: str = Field("10m", pattern=DURATION, description="With minReplicas 0: idle time (nothing "
                                     "waiting or running, no router demand) before going to zero")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(AUTOSCALING_BOUNDS)
        return self


AUTOSCALING_BOUNDS = ("autoscaling.minReplicas must be <= autoscaling.maxReplicas: raise maxReplicas or lower "
                      "minReplicas")
