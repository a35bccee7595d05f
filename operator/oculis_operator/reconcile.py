"""One GPUUpstream's desired world, from its spec and what was observed. Pure: no API calls.

Returns the writes to make (maybe none) and the status to report. A change whose plan does not fit
is refused here, before any write: the running Deployment is left exactly as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.router import PROVIDER_URLS
from oculis.upstream import Engine, GPUUpstreamSpec
from oculis_operator import capacity, catalog, engine_args, render, rollout
from oculis_operator.conditions import Conditions


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


@dataclass
class Outcome:
    status: dict[str, Any]
    create: list[dict[str, Any]] = field(default_factory=list)
    deployment_patch: dict[str, Any] | None = None  # merge patch for the existing Deployment
    log: list[str] = field(default_factory=list)


def reconcile(obs: Observed, spare_gpus: Callable[[str], int], now: str) -> Outcome:
    conds = Conditions(obs.status.get("conditions", []), obs.generation, now)
    status: dict[str, Any] = {"observedGeneration": obs.generation}
    try:
        spec = GPUUpstreamSpec.model_validate(obs.spec)
    except ValidationError as exc:
        msg = "invalid spec, nothing changed: " + format_errors(exc, "spec").replace("\n", "; ")
        conds.set("Degraded", "True", "InvalidSpec", msg)
        conds.set("Ready", "False", "InvalidSpec", msg)
        return Outcome({**obs.status, **status, "conditions": conds.items})
    if not spec.self_hosted:
        return _external(obs, spec, conds, status)
    return _self_hosted(obs, spec, conds, status, spare_gpus)


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


def _refuse(obs: Observed, conds: Conditions, status: dict[str, Any], reason: str, msg: str) -> Outcome:
    conds.set("CapacityOK", "False", reason, msg)
    running = obs.status.get("engineHash")
    where = f"the running Deployment is unchanged (engine hash {running})" if obs.deployment else "nothing deployed"
    conds.set("Ready", "False", "ChangeRefused", f"{msg}; {where}")
    conds.set("Progressing", "False", "ChangeRefused", f"change refused; {where}")
    conds.set("Degraded", "True", "ChangeRefused", f"change refused; {where}")
    keep = {k: v for k, v in obs.status.items() if k not in ("conditions", "observedGeneration")}
    return Outcome({**keep, **status, "conditions": conds.items}, log=[msg])


def _self_hosted(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any],
                 spare_gpus: Callable[[str], int]) -> Outcome:
    assert spec.gpu is not None
    product = gpus.lookup(spec.gpu.product)
    status["gpu"] = f"{spec.gpu.product} x{spec.gpu.count}"
    status["endpoint"] = render.endpoint(obs.name, obs.namespace)
    verdict = check(spec)
    if isinstance(verdict, tuple):
        return _refuse(obs, conds, status, *verdict)
    plan = verdict
    status["capacity"] = {"gpuMemoryBytes": plan.gpu_memory_bytes, "weightsBytesPerGpu": plan.weights_bytes_per_gpu,
                          "kvBytesPerToken": plan.kv_bytes_per_token, "kvCacheTokens": plan.kv_cache_tokens,
                          "maxConcurrency": plan.max_concurrency}
    if not plan.fits:
        return _refuse(obs, conds, status, "KVCacheExhausted", plan.message)
    conds.set("CapacityOK", "True", "Fits", plan.message)
    resolved = {"max_model_len": plan.max_model_len, "max_num_seqs": plan.max_num_seqs,
                "max_num_batched_tokens": plan.max_num_batched_tokens}
    try:
        argv = engine_args.build(spec, resolved)
    except engine_args.ExtraArgError as exc:
        return _refuse(obs, conds, status, "InvalidEngineArgs", str(exc))

    existing = obs.deployment
    strategy_reason = obs.status.get("rollout", "")
    out = Outcome({})
    current_strategy = ((existing or {}).get("spec", {}).get("strategy", {}) or {}).get("rollingUpdate")
    desired = render.deployment(obs.name, obs.namespace, obs.uid, spec, argv, plan.weights_bytes_per_gpu,
                                current_strategy or {"maxSurge": 1, "maxUnavailable": 0})
    desired_hash = desired["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH]
    status["desiredEngineHash"] = desired_hash
    if existing is None or _ann(existing, render.SPEC_HASH) != _ann(desired, render.SPEC_HASH):
        strat = rollout.choose_strategy(spec.rollout, spare_gpus(product.gfd_product), spec.gpu.count,
                                        spec.gpu.product)
        desired["spec"]["strategy"]["rollingUpdate"] = strat.rolling_update
        strategy_reason = strat.reason
        if existing is None:
            out.create.append(desired)
            out.log.append(f"Created Deployment {desired['metadata']['name']} ({strat.reason})")
        else:
            out.deployment_patch = {"metadata": {"annotations": desired["metadata"]["annotations"]},
                                    "spec": desired["spec"]}
            out.log.append(f"Rolling Deployment {desired['metadata']['name']} to engine hash {desired_hash} "
                           f"({strat.reason})")
    elif int(existing.get("spec", {}).get("replicas", 1)) != desired["spec"]["replicas"]:
        out.deployment_patch = {"spec": {"replicas": desired["spec"]["replicas"]}}  # no pod restarts
        out.log.append(f"Scaled Deployment {desired['metadata']['name']} to {desired['spec']['replicas']}")
    if not obs.has_service:
        out.create.append(render.service(obs.name, obs.namespace, obs.uid))
    if not obs.has_pdb:
        out.create.append(render.pod_disruption_budget(obs.name, obs.namespace, obs.uid))

    status["rollout"] = strategy_reason
    _report_progress(obs, existing, desired_hash, out.deployment_patch is not None or existing is None,
                     conds, status)
    out.status = {**status, "conditions": conds.items}
    return out


def check(spec: GPUUpstreamSpec) -> capacity.Plan | tuple[str, str]:
    """The capacity plan, or (reason, message) when the model or its draft cannot be planned at all."""
    assert spec.gpu is not None
    engine = spec.engine or Engine()
    try:
        model = catalog.lookup(spec.model, spec.model_config_)
    except KeyError as exc:
        return "UnknownModel", f"{capacity.UNKNOWN_MODEL}: {exc.args[0]}"
    draft = None
    sp = engine.speculative
    if sp and sp.enabled and sp.draft_model:
        try:
            draft = catalog.lookup(sp.draft_model)
        except KeyError as exc:
            return "UnknownModel", f"{capacity.UNKNOWN_MODEL}: speculative.draftModel: {exc.args[0]}"
        mismatch = capacity.draft_mismatch(model, draft, spec.model, sp.draft_model)
        if mismatch:
            return "TokenizerMismatch", mismatch
    return capacity.plan(model, gpus.lookup(spec.gpu.product), spec.gpu.count, engine, spec.traffic, draft,
                         spec.model)


def _report_progress(obs: Observed, existing: dict[str, Any] | None, desired_hash: str, writing: bool,
                     conds: Conditions, status: dict[str, Any]) -> None:
    status["engineHash"] = obs.status.get("engineHash")
    if existing is None:
        status.update(replicas=0, readyReplicas=0, updatedReplicas=0)
        conds.set("Progressing", "True", "Creating", "creating the Deployment")
        conds.set("Ready", "False", "Creating", "no replica is ready yet")
        conds.set("Degraded", "False", "AsExpected", "")
        return
    prog = rollout.progress(existing)
    running_hash = _template_hash(existing)
    status.update(replicas=prog.replicas, readyReplicas=prog.ready, updatedReplicas=prog.updated)
    done = prog.complete and not writing and running_hash == desired_hash
    if prog.complete and running_hash:
        status["engineHash"] = running_hash if not writing else obs.status.get("engineHash", running_hash)
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


def _ann(obj: dict[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def _template_hash(dep: dict[str, Any]) -> str | None:
    return _ann(dep.get("spec", {}).get("template", {}), render.ENGINE_HASH)
