"""How to roll engine changes, and how far a rollout has got. Pure.

Auto strategy: surge one replica when a spare GPU set of the product exists somewhere, otherwise
replace one replica at a time (maxSurge 0, maxUnavailable 1) so a full pool never deadlocks.
Progress is read from the Deployment's status: Ready only when every replica runs the new template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oculis import gpus
from oculis.rollout import Rollout


@dataclass(frozen=True)
class Strategy:
    rolling_update: dict[str, int]
    reason: str


def spare_gpus(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], gfd_product: str) -> int:
    """Largest number of unrequested GPUs of `gfd_product` on any one schedulable node."""
    used: dict[str, int] = {}
    for pod in pods:
        phase = pod.get("status", {}).get("phase")
        node = pod.get("spec", {}).get("nodeName")
        if not node or phase in ("Succeeded", "Failed"):
            continue
        for c in pod.get("spec", {}).get("containers", []):
            req = (c.get("resources") or {}).get("requests") or (c.get("resources") or {}).get("limits") or {}
            used[node] = used.get(node, 0) + int(req.get(gpus.GPU_RESOURCE, 0))
    best = 0
    for node in nodes:
        meta, spec, status = node.get("metadata", {}), node.get("spec", {}), node.get("status", {})
        if meta.get("labels", {}).get(gpus.GPU_PRODUCT_LABEL) != gfd_product or spec.get("unschedulable"):
            continue
        alloc = int(status.get("allocatable", {}).get(gpus.GPU_RESOURCE, 0))
        best = max(best, alloc - used.get(meta.get("name", ""), 0))
    return best


@dataclass(frozen=True)
class Pool:
    """The schedulable nodes of one GPU product, by their allocatable GPUs."""

    allocatable: tuple[int, ...]

    def replicas_that_fit(self, gpus_per_replica: int) -> int:
        """How many replicas of this size the nodes could ever hold, were they empty."""
        return sum(a // gpus_per_replica for a in self.allocatable)


def pool(nodes: list[dict[str, Any]], gfd_product: str) -> Pool:
    return Pool(tuple(
        int(n.get("status", {}).get("allocatable", {}).get(gpus.GPU_RESOURCE, 0)) for n in nodes
        if n.get("metadata", {}).get("labels", {}).get(gpus.GPU_PRODUCT_LABEL) == gfd_product
        and not n.get("spec", {}).get("unschedulable")))


def choose_strategy(rollout: Rollout | None, spare: int, gpus_per_replica: int, product: str) -> Strategy:
    r = rollout or Rollout()
    if r.strategy == "Manual" or r.max_surge is not None or r.max_unavailable is not None:
        surge = r.max_surge if r.max_surge is not None else 0
        unavailable = r.max_unavailable if r.max_unavailable is not None else (0 if surge else 1)
        return Strategy({"maxSurge": surge, "maxUnavailable": unavailable},
                        f"manual: maxSurge {surge}, maxUnavailable {unavailable}")
    if spare >= gpus_per_replica:
        return Strategy({"maxSurge": 1, "maxUnavailable": 0},
                        f"surge: a spare {product} x{gpus_per_replica} exists, no replica goes down")
    return Strategy({"maxSurge": 0, "maxUnavailable": 1},
                    f"one at a time: no spare {product} x{gpus_per_replica} for a surge pod, so one replica "
                    "is replaced at a time")


@dataclass(frozen=True)
class Progress:
    complete: bool  # every desired replica runs the current template and is ready
    replicas: int
    updated: int
    ready: int
    summary: str


def progress(deployment: dict[str, Any]) -> Progress:
    spec, status = deployment.get("spec", {}), deployment.get("status", {}) or {}
    want = int(spec.get("replicas", 1))
    current = status.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 0)
    total = int(status.get("replicas", 0) or 0)
    updated = int(status.get("updatedReplicas", 0) or 0)
    ready = int(status.get("readyReplicas", 0) or 0)
    available = int(status.get("availableReplicas", 0) or 0)
    complete = current and updated == want and ready == want and available == want and total == want
    summary = f"{updated}/{want} replicas updated, {ready} ready" + ("" if total <= want else f", {total - want} old")
    return Progress(complete, want, updated, ready, summary)
