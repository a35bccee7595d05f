"""What the operator writes into a GPUUpstream's status: conditions, the KV-cache plan, the canary,
speculative-decoding and autoscaling decisions, and the printer columns.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from oculis.adapters import AdapterStatus
from oculis.base import Model
from oculis.condition import Condition


class Capacity(Model):
    """The KV-cache plan for the current spec, per GPU."""

    gpu_memory_bytes: int
    """Memory of one GPU"""
    weights_bytes_per_gpu: int
    """Model weights on each GPU"""
    kv_bytes_per_token: int
    """KV cache bytes one token takes on each GPU"""
    kv_cache_tokens: int
    """Tokens the KV cache holds"""
    max_concurrency: int
    """Sequences of the planned length that fit at once"""
    planned_tokens: int | None = None
    """KV tokens the plan expects the engine to report"""
    observed_tokens: int | None = None
    """KV tokens the running engines report (vllm:cache_config_info num_gpu_blocks, the smallest replica)"""
    error_percent: float | None = None
    """(planned - observed) / observed in %; above 5 raises CapacityOK reason PlanDrift"""


class CanaryCheck(Model):
    """One check of the last canary interval: canary against stable and the limit."""

    name: str
    """ttftP95Ms, itlP95Ms, e2eP95Ms, preemptionsPerMinute or errorRate"""
    canary: float | None = None
    """The canary's figure (none: no samples)"""
    stable: float | None = None
    """The stable pods' figure"""
    limit: float | None = None
    """The ceiling the canary had to meet"""
    ok: bool
    """Whether the check passed"""
    message: str = ""
    """Why it failed"""


class CanaryStatus(Model):
    """The canary analysis of one spec generation."""

    generation: int
    """The spec generation canaried"""
    engine_hash: str
    """The canary's engine hash"""
    phase: Literal["WaitingForGPUs", "Analyzing", "Promoted", "RolledBack"]
    """Where the canary is"""
    decision: Literal["Promote", "Rollback", "Continue", "Inconclusive"] | None = None
    """The last decision"""
    started_at: str | None = None
    """When the canary replicas were created"""
    last_check_at: str | None = None
    """When the last interval was analysed"""
    intervals: int = 0
    """Intervals analysed"""
    failed_intervals: int = 0
    """Intervals with a failed check"""
    canary_requests: float | None = None
    """Finished canary requests in the last interval"""
    checks: list[CanaryCheck] = Field(default_factory=list)
    """The last interval's checks"""
    message: str = ""
    """The decision in words, with the figures"""
    summary: str = ""
    """Printer column, e.g. 3/10 ttft ok itl ok"""


class SpeculativeStatus(Model):
    """Speculative decoding as measured over the window."""

    acceptance_rate: float | None = None
    """Accepted / draft tokens over the window"""
    mean_accepted_length: float | None = None
    """1 + accepted tokens per draft: tokens each verification step yields"""
    draft_tokens: float | None = None
    """Draft tokens proposed in the window"""
    window: str
    """The window, e.g. 60s"""
    decision: Literal["Keep", "Watching", "Disable", "Disabled", "TooFewTokens", "NoData"]
    """Keep, Watching (below the threshold since lowSince), Disable(d), TooFewTokens or NoData"""
    low_since: str | None = None
    """Since when the acceptance has been below the threshold"""
    disabled_generation: int | None = None
    """The spec generation whose speculation the guard turned off"""
    message: str = ""
    """The decision with the figures"""


class AutoscalingStatus(Model):
    """The last autoscaling decision and the stabilisation state the next one starts from."""

    desired_replicas: int
    """Replicas asked of the Deployment (printer column DESIRED)"""
    reason: str
    """Why: ScaleUp, ScaleDown, Steady, StabilizingUp, WaitingForGPUs, ScaledToZero, MetricsMissing, ..."""
    message: str = ""
    """The figures behind it"""
    above_since: str | None = None
    """Since when the load has asked for more"""
    up_target: int | None = None
    """Lowest count asked for since aboveSince"""
    below_since: str | None = None
    """Since when the load has asked for fewer"""
    down_target: int | None = None
    """Highest count asked for since belowSince"""
    idle_since: str | None = None
    """Since when nothing waits or runs and the router has no demand"""


class GPUUpstreamStatus(Model):
    """What the operator did and sees."""

    observed_generation: int | None = None
    """The spec generation last reconciled"""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, CapacityOK, Progressing and Degraded"""
    replicas: int | None = None
    """Replicas of the engine Deployment"""
    ready_replicas: int | None = None
    """Replicas that are Ready"""
    updated_replicas: int | None = None
    """Replicas on the current pod template"""
    capacity: Capacity | None = None
    """The KV-cache plan"""
    engine_hash: str | None = Field(None, description="Hash of the engine settings every ready replica runs")
    desired_engine_hash: str | None = None
    """Hash of the engine settings the spec asks for"""
    endpoint: str | None = None
    """In-cluster URL of the OpenAI-compatible API"""
    served_model: str | None = None
    """The name every ready replica answers, the router's model for it: the upstream's own name, kept across
    spec.model changes"""
    gpu: str | None = Field(None, description="Printer column: product x count")
    canary: CanaryStatus | None = None
    """The canary analysis of an engine change: phase, last decision and its figures"""
    speculative: SpeculativeStatus | None = None
    """Measured speculative-decoding acceptance and what the guard decided"""
    rollout: str | None = Field(None, description="What the rollout is doing or waiting for")
    autoscaling: AutoscalingStatus | None = None
    """spec.autoscaling: the last decision, its figures and the stabilisation state"""
    adapters: list[AdapterStatus] | None = None
    """spec.adapters on the running engines: per adapter, the ready replicas holding it and why not all do"""
    adapters_ready: str | None = Field(None, description="Printer column ADAPTERS: adapters on every ready "
                                       "replica / adapters declared")
