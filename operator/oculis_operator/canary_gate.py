"""An engine change under `rollout.strategy: Canary`: the canary Deployment beside the stable one, its
analysis each interval (`canary.analyze`), promotion or rollback, and the conditions while it holds
the stable Deployment as it is. Pure: no API calls.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from oculis import gpus
from oculis.rollout import Canary
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import canary, render, rollout
from oculis_operator.conditions import Conditions
from oculis_operator.reconcile_io import Observed, Outcome

# status.canary's keys and their value when unset; a key left out of a merge patch would keep the
# previous generation's figure (an earlier canary's failed intervals counted against the next).
CANARY_KEYS: dict[str, Any] = {"generation": None, "engineHash": None, "phase": None, "decision": None,
                               "startedAt": None, "lastCheckAt": None, "intervals": 0, "failedIntervals": 0,
                               "canaryRequests": None, "checks": [], "message": "", "summary": ""}


def gate(obs: Observed, spec: GPUUpstreamSpec, policy: Canary, desired: dict[str, Any], desired_hash: str,
         spare: Callable[[], int], now: str, status: dict[str, Any],
         out: Outcome) -> tuple[str, str, str] | None:
    """An engine change under Strategy Canary: None once promoted (the stable Deployment rolls as
    usual), otherwise (phase, reason, message) while the canary holds the stable Deployment as it is."""
    assert spec.gpu is not None
    prev = obs.status.get("canary") or {}
    mine = prev.get("generation") == obs.generation and prev.get("engineHash") == desired_hash
    cdep, cname = obs.canary_deployment, render.canary_name(obs.name)
    total = canary.intervals_total(policy)
    base = {"generation": obs.generation, "engineHash": desired_hash}

    def drop(why: str) -> None:
        if cdep is not None or obs.has_canary_service:
            out.delete_canary = True
            out.log.append(f"Deleted canary Deployment and Service {cname}: {why}")

    if mine and prev.get("phase") in ("Promoted", "RolledBack"):
        status["canary"] = prev
        drop("promoted" if prev["phase"] == "Promoted" else "rolled back")
        if prev["phase"] == "Promoted":
            return None
        return "RolledBack", "CanaryRolledBack", (f"canary of engine hash {desired_hash} rolled back, not retried for "
                                                  f"generation {obs.generation}: {prev.get('message', '')}; change "
                                                  "the spec to try again")
    old_labels = cdep is not None and (cdep.get("spec", {}).get("selector") or {}).get("matchLabels") \
        != render.canary_selector(obs.name)
    if cdep is not None and (render.template_hash(cdep) != desired_hash or old_labels):  # an earlier change's canary
        # (or one an older operator labelled so that the stable Service selects its pods too: a selector
        # cannot be changed, so it is replaced)
        drop(f"superseded by engine hash {desired_hash}" if not old_labels else
             "its pods carry the labels of an older operator, which the stable Service selects; replacing it")
        status["canary"] = {**base, "phase": "Analyzing", "summary": f"0/{total}", "message": "replacing the canary"}
        return "Analyzing", "CanaryAnalysis", f"replacing an earlier change's canary with engine hash {desired_hash}"
    if cdep is None:
        gfd = gpus.lookup(spec.gpu.product).gfd_product
        if spare() < spec.gpu.count:
            msg = (f"canary of engine hash {desired_hash} waits for a spare {spec.gpu.product} x{spec.gpu.count} in "
                   f"pool {gpus.GPU_PRODUCT_LABEL}={gfd}; the stable replicas keep serving unchanged")
            status["canary"] = {**base, "phase": "WaitingForGPUs", "summary": f"0/{total} waiting for GPUs",
                                "message": msg}
            return "WaitingForGPUs", "WaitingForGPUs", msg
        out.create.append(render.canary_deployment(desired, policy.replicas))
        if not obs.has_canary_service:
            out.create.append(render.canary_service(obs.name, obs.namespace, obs.uid))
        out.log.append(f"Created canary Deployment {cname} ({policy.replicas} replica(s), engine hash {desired_hash}) "
                       f"for {policy.duration}, checked every {policy.interval}")
        status["canary"] = {**base, "phase": "Analyzing", "summary": f"0/{total} starting",
                            "message": "starting the canary replicas"}
        return "Analyzing", "CanaryAnalysis", f"starting {policy.replicas} canary replica(s), hash {desired_hash}"
    if not obs.has_canary_service:  # deleted by hand, say: the router's canary share needs it
        out.create.append(render.canary_service(obs.name, obs.namespace, obs.uid))
    cur = {**base, **{k: v for k, v in prev.items() if mine and k not in base}, "phase": "Analyzing"}
    if not rollout.progress(cdep).complete:
        cur.setdefault("summary", f"0/{total} starting")
        status["canary"] = cur
        return "Analyzing", "CanaryAnalysis", f"waiting for the canary replicas of engine hash {desired_hash}: " \
            f"{rollout.progress(cdep).summary}"
    cur.setdefault("startedAt", now)
    if not cur.get("startedAt"):
        cur["startedAt"] = now
    if obs.canary_samples is None:  # no interval due yet
        cur.setdefault("summary", f"0/{total}")
        status["canary"] = cur
        return "Analyzing", "CanaryAnalysis", f"canary {cur['summary']}: {cur.get('message') or 'analysing'}"
    c_sample, s_sample = obs.canary_samples
    elapsed = _seconds(str(cur["startedAt"]), now)
    d = canary.analyze(policy, c_sample, s_sample, elapsed, int(cur.get("failedIntervals") or 0))
    intervals = int(cur.get("intervals") or 0) + 1
    figures = "; ".join(f"{c.name} canary {_fmt(c.canary)} vs stable {_fmt(c.stable)} (limit {_fmt(c.limit)})"
                        + ("" if c.ok else f" FAILED: {c.message}") for c in d.checks)
    cur.update(decision=d.verdict, lastCheckAt=now, intervals=intervals, failedIntervals=d.failed_intervals,
               canaryRequests=None if c_sample is None else c_sample.requests,
               checks=[c.as_status() for c in d.checks], message=d.message + (f" [{figures}]" if figures else ""),
               summary=canary.summary(intervals, total, d.checks, d.verdict))
    status["canary"] = cur
    if d.verdict == "Promote":
        cur["phase"] = "Promoted"
        drop("promoted")
        out.log.append(f"Canary of engine hash {desired_hash} promoted: {cur['message']}")
        return None
    if d.verdict in ("Rollback", "Inconclusive"):
        cur["phase"] = "RolledBack"
        drop("rolled back")
        msg = f"canary of engine hash {desired_hash} rolled back ({d.verdict}): {cur['message']}"
        out.warnings.append(("CanaryRolledBack", msg))
        return "RolledBack", "CanaryRolledBack", msg + "; the stable Deployment is unchanged; change the spec to retry"
    return "Analyzing", "CanaryAnalysis", f"canary {cur['summary']}: {cur['message'] or 'every check passed so far'}"


def hold_conditions(existing: dict[str, Any] | None, held: tuple[str, str, str], conds: Conditions,
                    status: dict[str, Any]) -> None:
    """While a canary holds the roll the stable replicas serve as before: Ready from them, Progressing
    during the analysis (GitOps health shows it), Degraded once it rolled back."""
    phase, reason, msg = held
    stable = rollout.progress(existing) if existing is not None else None
    if stable is not None and stable.complete and stable.replicas > 0:
        conds.set("Ready", "True", "StableServing", f"the stable replicas serve engine hash {status.get('engineHash')}"
                  f" ({stable.summary}); {phase.lower()} canary")
    if phase == "RolledBack":
        conds.set("Progressing", "False", reason, msg)
        conds.set("Degraded", "True", reason, msg)
    else:
        conds.set("Progressing", "True", reason, msg)
        conds.set("Degraded", "False", "AsExpected", "")


def _fmt(v: float | None) -> str:
    return "none" if v is None else f"{v:.4g}"


def _seconds(earlier: str, later: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        return (datetime.datetime.strptime(later, fmt) - datetime.datetime.strptime(earlier, fmt)).total_seconds()
    except ValueError:
        return 0.0
