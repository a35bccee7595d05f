"""A route's upstreams: which it names (its tiers', then its verifier's) and whether each can answer
its requests (ready, progressing, scaled to zero, not ready). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oculis.router import RouteBody
from oculis_operator.conditions import condition

# An upstream as a route's tier sees it (`upstream_state`).
READY, PROGRESSING, SCALED_TO_ZERO, NOT_READY = "ready", "progressing", "scaled-to-zero", "not-ready"


def ready(obj: dict[str, Any]) -> bool:
    return condition(obj.get("status"), "Ready").get("status") == "True"


def verifier_of(body: RouteBody) -> str | None:
    """The upstream that grades the route's answers (escalation.on_answer.verifier), or None."""
    check = body.escalation.on_answer
    return check.verifier.upstream if check is not None and check.verifier is not None else None


def route_upstreams(body: RouteBody) -> list[str]:
    """The upstreams a route names, each once: its tiers' in order, then its verifier's. Every place that
    renders, checks or carries a route's upstreams reads this, so none can leave the verifier out."""
    verifier = verifier_of(body)
    return list(dict.fromkeys([*(t.upstream for t in body.tiers), *([verifier] if verifier else [])]))


def answered_at_zero(cold_start: str, tier_upstreams: list[str], states: Mapping[str, str]) -> str | None:
    """How the route's requests are answered while some of its upstreams are scaled to zero, or None
    when some are not (then the route is not Ready). Only coldStart escalate answers at once, and only
    when every tier at zero has a later tier whose upstream serves (the router escalates upwards,
    decide.cold_start); wait holds requests for a cold engine, which may outlast the wait."""
    if cold_start != "escalate":
        return None
    for i, u in enumerate(tier_upstreams):
        if states[u] == SCALED_TO_ZERO and not any(states[v] == READY for v in tier_upstreams[i + 1:]):
            return None
    return "coldStart escalate: their tiers' requests are answered by the next tier that serves until they wake"


def upstream_state(obj: dict[str, Any] | None) -> str:
    """Can this upstream answer a tier's requests? Ready, or a self-hosted one with a ready replica
    (a rolling update or a refused change keeps the old replicas answering); otherwise scaled to zero,
    still coming up (no status yet, or Progressing and not Degraded), or not Ready (Degraded)."""
    if obj is None:
        return NOT_READY
    status = obj.get("status") or {}
    if ready(obj) or ((obj.get("spec") or {}).get("provider") == "vllm" and (status.get("readyReplicas") or 0) > 0):
        return READY
    ready_cond = condition(status, "Ready")
    if ready_cond.get("reason") == "ScaledToZero":
        return SCALED_TO_ZERO
    degraded = condition(status, "Degraded").get("status") == "True"
    if not degraded and (not ready_cond or condition(status, "Progressing").get("status") == "True"):
        return PROGRESSING
    return NOT_READY


def not_ready_because(obj: dict[str, Any]) -> str:
    """`name (Reason)`: why an upstream is not Ready, as its own Ready condition says."""
    return f"{obj['metadata']['name']} ({condition(obj.get('status'), 'Ready').get('reason', 'not reconciled yet')})"
