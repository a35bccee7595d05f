"""What one GPUUpstream's reconcile reads and returns: `Observed`, filled by the shell (handlers) from
the API and Prometheus, and `Outcome`, the writes to make and the status to report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oculis_operator import adapter_loading, autoscale, canary, speculative


@dataclass(frozen=True)
class Observed:
    name: str
    namespace: str
    uid: str
    generation: int
    spec: dict[str, Any]
    status: dict[str, Any]
    deployment: dict[str, Any] | None = None
    has_service: bool = True
    has_pdb: bool = True
    secret: str | None = None  # external: "ok", "missing-secret", "missing-key"
    pending_reasons: list[str] = field(default_factory=list)
    service: dict[str, Any] | None = None  # the live objects, compared with what we render
    pdb: dict[str, Any] | None = None
    # spec.modelConfigFrom: the config.json text read from its ConfigMap, or why it could not be read
    model_config_text: str | None = None
    model_config_problem: str | None = None
    # The smallest num_gpu_blocks the engine's replicas report (vllm:cache_config_info via Prometheus)
    observed_kv_blocks: int | None = None
    # Speculative decoding over the guard's window (vllm:spec_decode_* via Prometheus), None: not read
    speculation: speculative.Sample | None = None
    speculative_window_s: int = 300
    # The canary Deployment (<name>-vllm-canary) and, when an interval was due, (canary, stable) figures
    canary_deployment: dict[str, Any] | None = None
    has_canary_service: bool = False  # the canary Service <name>-vllm-canary exists (read with the Deployment)
    canary_samples: tuple[canary.Sample | None, canary.Sample | None] | None = None
    # spec.autoscaling: the shell's decision (autoscale.decide) from metrics, router demand and the pool
    autoscale: autoscale.Decision | None = None
    # picker kv-events: the router's count of replicas it hears no KV events from (Prometheus); None: not read
    kv_events_silent: float | None = None
    # LoRA: the declared adapters on the ready engines at the adapter sync's last pass; None: not looked yet
    adapters: adapter_loading.Report | None = None


@dataclass
class Outcome:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    deployment_patch: dict[str, Any] | None = None  # JSON merge patch for the existing Deployment
    service_patch: dict[str, Any] | None = None  # JSON merge patches reverting hand edits
    pdb_patch: dict[str, Any] | None = None
    delete_canary: bool = False  # remove the canary Deployment and Service (promoted, rolled back or superseded)
    log: list[str] = field(default_factory=list)  # what was done: logged and posted as Normal events
    # (reason, message) of what is wrong: posted as Warning events once while it lasts
    warnings: list[tuple[str, str]] = field(default_factory=list)
