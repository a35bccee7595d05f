"""One GPUUpstream's desired world, from its spec and what was observed. Pure: no API calls.

Returns the writes to make (maybe none) and the status to report. A change whose plan does not fit
is refused here, before any write: the running Deployment is left exactly as it was. What we made
stays as we made it: a hand edit of the Deployment, Service or PodDisruptionBudget (compared field
by field with what we render, `drift.py`) is reverted and reported, and the status is not Ready
until the live objects are ours again. A GPU request no node of the product can ever host is
Degraded (`NoNodeCanHost`, `ExceedsPool`), not silently Pending.

Its parts: `reconcile_io` (what it reads and returns), `capacity_check` (the plan, the pool, the
observed KV cache), `canary_gate` (an engine change under a canary) and `feature_status`
(speculation guard, KV events, LoRA adapters).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.rollout import Canary
from oculis.router_upstream import PROVIDER_URLS
from oculis.upstream import DNS_1035, MAX_NAME, GPUUpstreamSpec
from oculis_operator import (
    adapter_loading,
    autoscale,
    canary_gate,
    capacity_check,
    drift,
    engine_args,
    feature_status,
    render,
    rollout,
)
from oculis_operator.capacity_check import check as check  # re-exported: tests/realengine imports it from here
from oculis_operator.conditions import Conditions
from oculis_operator.reconcile_io import Observed, Outcome


def reconcile(obs: Observed, spare_gpus: Callable[[str], int], now: str,
              pool: Callable[[str], rollout.Pool] | None = None) -> Outcome:
    """`spare_gpus(gfd_product)`: the most free GPUs on one node (asked only when rolling);
    `pool(gfd_product)`: the product's nodes (asked only while some replica is not running)."""
    conds = Conditions(obs.status.get("conditions", []), obs.generation, now)
    status: dict[str, Any] = {"observedGeneration": obs.generation}
    bad_name = invalid_name(obs.name)
    if bad_name:
        conds.set("Degraded", "True", "InvalidName", bad_name)
        conds.set("Ready", "False", "InvalidName", bad_name)
        return Outcome({**obs.status, **status, "conditions": conds.items}, warnings=[("InvalidName", bad_name)])
    try:
        spec = GPUUpstreamSpec.model_validate(obs.spec)
    except ValidationError as exc:
        msg = "invalid spec, nothing changed: " + format_errors(exc, "spec").replace("\n", "; ")
        conds.set("Degraded", "True", "InvalidSpec", msg)
        conds.set("Ready", "False", "InvalidSpec", msg)
        return Outcome({**obs.status, **status, "conditions": conds.items})
    if not spec.self_hosted:
        return _external(obs, spec, conds, status)
    return _self_hosted(obs, spec, conds, status, spare_gpus, pool, now)


def _external(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any]) -> Outcome:
    ref = spec.api_key_secret_ref
    status["endpoint"] = spec.base_url or PROVIDER_URLS.get(spec.provider, "")
    conds.set("CapacityOK", "True", "External", "external provider: no GPUs to plan")
    conds.set("Progressing", "False", "External", "no workload to roll")
    if ref is not None and obs.secret != "ok":
        what = (f"Secret {ref.name!r} not found in namespace {obs.namespace}" if obs.secret == "missing-secret"
                else f"Secret {ref.name!r} has no key {ref.key!r}")
        msg = f"{what}; create it (kubectl create secret generic {ref.name} --from-literal={ref.key}=...)"
        conds.set("Ready", "False", "SecretNotFound" if obs.secret == "missing-secret" else "SecretKeyMissing", msg)
        conds.set("Degraded", "True", "SecretUnresolved", msg)
    else:
        conds.set("Ready", "True", "SecretResolved" if ref else "NoCredentials",
                  "the provider is usable as configured")
        conds.set("Degraded", "False", "AsExpected", "")
    return Outcome({**status, "conditions": conds.items})


def invalid_name(name: str) -> str | None:
    """Why no Service can be named after this upstream, or None. (The CRD refuses such names at apply;
    this catches objects stored before that rule.)"""
    if re.fullmatch(DNS_1035, name) and len(name) <= MAX_NAME:
        return None
    return (f"metadata.name {name!r} is not a DNS-1035 label of at most {MAX_NAME} characters (lower-case letters, "
            "digits and '-', starting with a letter), so its Service cannot exist; nothing was created: recreate the "
            "upstream under a name like llama-8b")


def _refuse(obs: Observed, conds: Conditions, status: dict[str, Any], reason: str, msg: str) -> Outcome:
    status["capacity"] = None  # no KV-TOKENS / MAX-CONC for a spec that is not deployed
    conds.set("CapacityOK", "False", reason, msg)
    running = obs.status.get("engineHash")
    where = f"the running Deployment is unchanged (engine hash {running})" if obs.deployment else "nothing deployed"
    conds.set("Ready", "False", "ChangeRefused", f"{msg}; {where}")
    conds.set("Progressing", "False", "ChangeRefused", f"change refused; {where}")
    # The cause in Degraded too: GitOps health (Argo CD) shows Degraded's message.
    conds.set("Degraded", "True", "ChangeRefused", f"change refused: {msg}; {where}")
    keep = {k: v for k, v in obs.status.items() if k not in ("conditions", "observedGeneration")}
    return Outcome({**keep, **status, "conditions": conds.items}, warnings=[("ChangeRefused", msg)])


def _self_hosted(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any],
                 spare_gpus: Callable[[str], int], pool: Callable[[str], rollout.Pool] | None,
                 now: str = "") -> Outcome:
    assert spec.gpu is not None
    product = gpus.lookup(spec.gpu.product)
    status["gpu"] = f"{spec.gpu.product} x{spec.gpu.count}"
    status["endpoint"] = render.endpoint(obs.name, obs.namespace)
    guard_warnings: list[tuple[str, str]] = []
    scaled = obs.autoscale if spec.autoscaling is not None else None
    if scaled is not None:
        # The decision sets the Deployment's replicas only; spec.replicas stays the user's.
        spec = spec.model_copy(update={"replicas": scaled.desired})
        status["autoscaling"] = autoscale.to_status(scaled)
        conds.set("ScalingActive", *(("True", "MetricsAvailable", scaled.message) if scaled.metrics_ok
                                     else ("False", scaled.reason, scaled.message)))
    spec = feature_status.speculation_guard(obs, spec, conds, status, now, guard_warnings)
    assert spec.gpu is not None
    verdict = capacity_check.check(spec, obs.model_config_text, obs.model_config_problem)
    if isinstance(verdict, tuple):
        return _refuse(obs, conds, status, *verdict)
    plan = verdict
    if not plan.fits:
        reason = capacity_check.REFUSAL_REASONS.get(plan.error_code or "", "KVCacheExhausted")
        return _refuse(obs, conds, status, reason, plan.message)
    status["capacity"] = {"gpuMemoryBytes": plan.gpu_memory_bytes, "weightsBytesPerGpu": plan.weights_bytes_per_gpu,
                          "kvBytesPerToken": plan.kv_bytes_per_token, "kvCacheTokens": plan.kv_cache_tokens,
                          "maxConcurrency": plan.max_concurrency, "plannedTokens": plan.kv_cache_tokens}
    conds.set("CapacityOK", "True", "Fits", plan.message)
    resolved = {"max_model_len": plan.max_model_len, "max_num_seqs": plan.max_num_seqs,
                "max_num_batched_tokens": plan.max_num_batched_tokens}
    try:
        argv = engine_args.build(spec, resolved, alias=obs.name)
    except engine_args.ExtraArgError as exc:
        return _refuse(obs, conds, status, "InvalidEngineArgs", str(exc))

    existing = obs.deployment
    strategy_reason = obs.status.get("rollout", "")
    out = Outcome({}, warnings=guard_warnings)
    current_strategy = ((existing or {}).get("spec", {}).get("strategy", {}) or {}).get("rollingUpdate")
    desired = render.deployment(obs.name, obs.namespace, obs.uid, spec, argv, plan.weights_bytes_per_gpu,
                                current_strategy or {"maxSurge": 1, "maxUnavailable": 0})
    desired_hash = desired["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH]
    status["desiredEngineHash"] = desired_hash
    # Same spec as last written: whatever else differs was edited by hand (replicas aside: scaling
    # never restarts pods, and is handled below).
    same_spec = existing is not None and \
        render.annotation(existing, render.SPEC_HASH) == render.annotation(desired, render.SPEC_HASH)
    edited = [d for d in drift.differences(desired, existing, drift.DEPLOYMENT) if d != "spec.replicas"] \
        if same_spec else []
    reverted = [f"Deployment {desired['metadata']['name']}: {', '.join(edited)}"] if edited else []
    if edited:
        out.deployment_patch = drift.revert_patch(desired, existing, drift.DEPLOYMENT)
    canary_held: tuple[str, str, str] | None = None  # (phase, reason, message) while the canary holds the roll
    if (not edited and not same_spec and existing is not None and spec.rollout is not None
            and spec.rollout.strategy == "Canary" and render.template_hash(existing) != desired_hash):
        canary_held = canary_gate.gate(obs, spec, spec.rollout.canary or Canary(), desired, desired_hash,
                                   lambda: spare_gpus(product.gfd_product), now, status, out)
        if "canary" in status:  # every key, null where unset: the status write is a merge patch
            status["canary"] = {k: status["canary"].get(k, default) for k, default in canary_gate.CANARY_KEYS.items()}
    elif obs.canary_deployment is not None or obs.has_canary_service:  # no canary wanted: none may take traffic
        out.delete_canary = True
        out.log.append(f"Deleted canary Deployment and Service {render.canary_name(obs.name)}: no canary in progress")
    if canary_held is None and "canary" not in status and obs.status.get("canary"):
        status["canary"] = obs.status["canary"]  # the last decision and its figures stay shown
    if edited or canary_held is not None:
        pass  # reverted above, or the canary holds the stable Deployment exactly as it is
    elif not same_spec:
        strat = rollout.choose_strategy(spec.rollout, spare_gpus(product.gfd_product), spec.gpu.count,
                                        spec.gpu.product)
        desired["spec"]["strategy"]["rollingUpdate"] = strat.rolling_update
        strategy_reason = strat.reason
        if existing is None:
            out.create.append(desired)
            out.log.append(f"Created Deployment {desired['metadata']['name']} ({strat.reason})")
        else:
            strategy_reason += adapter_loading.volume_roll(existing, desired)
            out.deployment_patch = drift.revert_patch(desired, existing, drift.DEPLOYMENT)
            out.log.append(f"Rolling Deployment {desired['metadata']['name']} to engine hash {desired_hash} "
                           f"({strategy_reason})")
    elif existing is not None and int(existing.get("spec", {}).get("replicas", 1)) != desired["spec"]["replicas"]:
        out.deployment_patch = {"spec": {"replicas": desired["spec"]["replicas"]}}  # no pod restarts
        out.log.append(f"Scaled Deployment {desired['metadata']['name']} to {desired['spec']['replicas']}")
    service = render.service(obs.name, obs.namespace, obs.uid)
    pdb = render.pod_disruption_budget(obs.name, obs.namespace, obs.uid)
    if not obs.has_service:
        out.create.append(service)
    elif obs.service is not None and (edits := drift.differences(service, obs.service, drift.SERVICE)):
        out.service_patch = drift.revert_patch(service, obs.service, drift.SERVICE)
        reverted.append(f"Service {service['metadata']['name']}: {', '.join(edits)}")
    if not obs.has_pdb:
        out.create.append(pdb)
    elif obs.pdb is not None and (edits := drift.differences(pdb, obs.pdb, drift.PDB)):
        out.pdb_patch = drift.revert_patch(pdb, obs.pdb, drift.PDB)
        reverted.append(f"PodDisruptionBudget {pdb['metadata']['name']}: {', '.join(edits)}")
    if reverted:
        out.log.append(f"Reverted hand edits of {'; '.join(reverted)}")
        out.warnings.append(("DriftReverted", f"reverted hand edits of {'; '.join(reverted)}; the GPUUpstream owns "
                                              "these fields, so change its spec instead"))

    status["rollout"] = strategy_reason
    done = _report_progress(obs, existing, desired_hash, out.deployment_patch is not None or existing is None,
                            conds, status)
    if canary_held is not None:
        canary_gate.hold_conditions(existing, canary_held, conds, status)
    if done:
        capacity_check.check_observed(obs, plan, conds, status, out)
    if reverted:
        # Never Ready while a live object differs from what we own; the next reconcile sees the revert.
        conds.set("Ready", "False", "DriftReverted", f"hand edits reverted ({'; '.join(reverted)}); waiting for the "
                  "live objects to match the spec again")
    if scaled is not None and scaled.wait:
        # A scale-up the pool cannot place: asked for what fits, the rest reported (once: stable words).
        conds.set("Progressing", "True", "WaitingForGPUs", scaled.wait)
        out.warnings.append(("WaitingForGPUs", scaled.wait_event or scaled.wait))
    if not done and pool is not None:
        problem = capacity_check.unhostable(spec, pool(product.gfd_product))
        if problem:
            conds.set("Degraded", "True", *problem)
            conds.set("Ready", "False", *problem)
            out.warnings.append(problem)
    feature_status.kv_events(obs, spec, conds, out)
    feature_status.adapters(obs, spec, conds, status, out)
    out.status = {**status, "conditions": conds.items}
    return out


def _report_progress(obs: Observed, existing: dict[str, Any] | None, desired_hash: str, writing: bool,
                     conds: Conditions, status: dict[str, Any]) -> bool:
    """Set the progress conditions; True when every replica runs the desired engine."""
    status["engineHash"] = obs.status.get("engineHash")
    if existing is None:
        status.update(replicas=0, readyReplicas=0, updatedReplicas=0)
        conds.set("Progressing", "True", "Creating", "creating the Deployment")
        conds.set("Ready", "False", "Creating", "no replica is ready yet")
        conds.set("Degraded", "False", "AsExpected", "")
        return False
    prog = rollout.progress(existing)
    running_hash = render.template_hash(existing)
    status.update(replicas=prog.replicas, readyReplicas=prog.ready, updatedReplicas=prog.updated)
    done = prog.complete and not writing and running_hash == desired_hash
    if prog.complete and running_hash:
        status["engineHash"] = running_hash if not writing else obs.status.get("engineHash", running_hash)
    # Every replica answers the alias only once all run the current template (engine_args.build).
    status["servedModel"] = obs.name if done else obs.status.get("servedModel")
    waiting = "; ".join(sorted(set(obs.pending_reasons)))
    if done:
        conds.set("Progressing", "False", "RolloutComplete", f"all {prog.replicas} replicas run engine hash "
                  f"{desired_hash}")
        if prog.replicas == 0:  # nothing serves: not Ready, so routes say so and the router fails over
            conds.set("Ready", "False", "ScaledToZero", "replicas is 0: no engine serves this upstream")
        else:
            conds.set("Ready", "True", "AllReplicasReady", prog.summary)
        conds.set("Degraded", "False", "AsExpected", "")
    else:
        msg = f"rolling to engine hash {desired_hash}: {prog.summary}; {status.get('rollout', '')}"
        conds.set("Progressing", "True", "WaitingForGPUs" if waiting else "RollingUpdate",
                  msg + (f"; waiting: {waiting}" if waiting else ""))
        conds.set("Ready", "False", "RollingUpdate", f"not every replica runs engine hash {desired_hash} yet")
        conds.set("Degraded", "False", "AsExpected", "")
    return done


