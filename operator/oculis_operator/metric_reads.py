"""The Prometheus reads a GPUUpstream's reconcile takes as input: the speculative-decoding window, the
canary and stable samples of a due canary interval, and the autoscaler's engine metrics, router
demand and placeable replicas (then its decision).
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import ValidationError

from oculis import gpus
from oculis.autoscaling import Autoscaling
from oculis.formats import duration_seconds
from oculis.placement import GPU
from oculis.rollout import Canary
from oculis_operator import autoscale, canary, promquery, render, speculative
from oculis_operator.conditions import utc_now
from oculis_operator.kube import Kube
from oculis_operator.settings import AUTOSCALE_DEMAND_WINDOW_SECONDS, PROMETHEUS_URL, SPECULATIVE_WINDOW_SECONDS


def read_speculation(namespace: str, name: str) -> speculative.Sample | None:
    """The guard's window from Prometheus; None when nothing came back (unreachable or not scraped)."""
    values = {k: promquery.prometheus_value(PROMETHEUS_URL, q)
              for k, q in speculative.queries(namespace, name, SPECULATIVE_WINDOW_SECONDS).items()}
    if values["draft_tokens"] is None and values["accepted_total"] is None:
        return None
    return speculative.Sample(**values)


def read_canary(namespace: str, name: str, spec: dict[str, Any],
                status: dict[str, Any]) -> tuple[canary.Sample | None, canary.Sample | None] | None:
    """(canary, stable) over the last interval when one is due, else None. Without Prometheus both are
    None: no samples, which never promotes."""
    try:
        policy = Canary.model_validate((spec.get("rollout") or {}).get("canary") or {})
    except ValueError:
        return None  # the reconcile reports the invalid spec
    if not canary.due(status, policy, utc_now()):
        return None
    window = max(1, duration_seconds(policy.interval))
    read = {track: canary.sample({k: promquery.prometheus_value(PROMETHEUS_URL, q)
                                  for k, q in canary.queries(namespace, name, track, window).items()})
            for track in ("canary", "stable")}
    return read["canary"], read["stable"]


def autoscale_decision(kube: Kube, spec: dict[str, Any], status: dict[str, Any], dep: dict[str, Any] | None, ns: str,
               name: str) -> autoscale.Decision | None:
    """spec.autoscaling: read the engines' metrics, the router's demand and the pool's free GPUs, then
    decide (autoscale.decide). None when the spec has no (valid) autoscaling block or GPU."""
    try:
        auto = Autoscaling.model_validate(spec["autoscaling"]) if spec.get("autoscaling") else None
        gpu = GPU.model_validate(spec["gpu"]) if spec.get("gpu") else None
    except ValidationError:
        return None  # the reconcile reports the invalid spec
    if auto is None or gpu is None:
        return None
    policy = autoscale.Policy.of(auto)
    replicas = spec.get("replicas")
    current = int((dep or {}).get("spec", {}).get("replicas", 1)) if dep is not None else (
        int(replicas) if replicas is not None else max(1, auto.min_replicas))
    ready = int(((dep or {}).get("status") or {}).get("readyReplicas") or 0)

    def query(q: str) -> list[dict[str, Any]] | None:
        return promquery.prometheus_result(PROMETHEUS_URL, q)

    gfd = gpus.lookup(gpu.product).gfd_product
    nodes, pods = kube.gpu_nodes_and_pods(gfd)  # pods on those nodes only: ours that hold GPUs
    scheduled = sum(1 for p in pods if p["metadata"].get("namespace") == ns
                    and (p["metadata"].get("labels") or {}).get(render.UPSTREAM_LABEL) == name)
    return autoscale.decide(
        policy, current, ready, autoscale.sample_from(query, ns, name) if dep is not None else None,
        autoscale.demand_from(query, ns, name, AUTOSCALE_DEMAND_WINDOW_SECONDS),
        autoscale.state_from_status(status.get("autoscaling")), time.time(),
        autoscale.placeable_replicas(nodes, pods, gfd, gpu.count, scheduled), pool=gpu.product)
