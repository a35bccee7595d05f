"""One GPUUpstream's desired world, from its spec and what was observed. Pure: no API calls.

Returns the writes to make (maybe none) and the status to report. A change whose plan does not fit
is refused here, before any write: the running Deployment is left exactly as it was. What we made
stays as we made it: a hand edit of the Deployment, Service or PodDisruptionBudget (compared field
by field with what we render, `drift.py`) is reverted and reported, and the status is not Ready
until the live objects are ours again. A GPU request no node of the product can ever host is
Degraded (`NoNodeCanHost`, `ExceedsPool`), not silently Pending.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.engine import Engine
from oculis.rollout import Canary
from oculis.router import PROVIDER_URLS
from oculis.upstream import DNS_1035, MAX_NAME, GPUUpstreamSpec
from oculis_operator import (
    adapter_loading,
    autoscale,
    canary,
    capacity,
    catalog,
    drift,
    engine_args,
    hfconfig,
    render,
    rollout,
    speculative,
)
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


# CapacityOK reasons say what was refused, per error code of the plan.
REFUSAL_REASONS = {capacity.KV_EXHAUSTED: "KVCacheExhausted", capacity.TP_MISMATCH: "TensorParallelHeads"}


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
    spec = _speculation_guard(obs, spec, conds, status, now, guard_warnings)
    assert spec.gpu is not None
    verdict = check(spec, obs.model_config_text, obs.model_config_problem)
    if isinstance(verdict, tuple):
        return _refuse(obs, conds, status, *verdict)
    plan = verdict
    if not plan.fits:
        return _refuse(obs, conds, status, REFUSAL_REASONS.get(plan.error_code or "", "KVCacheExhausted"),
                       plan.message)
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
    same_spec = existing is not None and _ann(existing, render.SPEC_HASH) == _ann(desired, render.SPEC_HASH)
    edited = [d for d in drift.differences(desired, existing, drift.DEPLOYMENT) if d != "spec.replicas"] \
        if same_spec else []
    reverted = [f"Deployment {desired['metadata']['name']}: {', '.join(edited)}"] if edited else []
    if edited:
        out.deployment_patch = drift.revert_patch(desired, existing, drift.DEPLOYMENT)
    canary_held: tuple[str, str, str] | None = None  # (phase, reason, message) while the canary holds the roll
    if (not edited and not same_spec and existing is not None and spec.rollout is not None
            and spec.rollout.strategy == "Canary" and _template_hash(existing) != desired_hash):
        canary_held = _canary_gate(obs, spec, spec.rollout.canary or Canary(), desired, desired_hash,
                                   lambda: spare_gpus(product.gfd_product), now, status, out)
        if "canary" in status:  # every key, null where unset: the status write is a merge patch
            status["canary"] = {k: status["canary"].get(k, default) for k, default in CANARY_KEYS.items()}
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
        _canary_conditions(existing, canary_held, conds, status)
    if done:
        _check_plan(obs, plan, conds, status, out)
    if reverted:
        # Never Ready while a live object differs from what we own; the next reconcile sees the revert.
        conds.set("Ready", "False", "DriftReverted", f"hand edits reverted ({'; '.join(reverted)}); waiting for the "
                  "live objects to match the spec again")
    if scaled is not None and scaled.wait:
        # A scale-up the pool cannot place: asked for what fits, the rest reported (once: stable words).
        conds.set("Progressing", "True", "WaitingForGPUs", scaled.wait)
        out.warnings.append(("WaitingForGPUs", scaled.wait_event or scaled.wait))
    if not done and pool is not None:
        problem = unhostable(spec, pool(product.gfd_product))
        if problem:
            conds.set("Degraded", "True", *problem)
            conds.set("Ready", "False", *problem)
            out.warnings.append(problem)
    _kv_events(obs, spec, conds, out)
    _adapters(obs, spec, conds, status, out)
    out.status = {**status, "conditions": conds.items}
    return out


def _adapters(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any], out: Outcome) -> None:
    """status.adapters, the ADAPTERS column and AdaptersReady from the adapter sync's last look. An adapter
    the engine will not load is a Warning and AdaptersReady=False naming it; Ready is the base model's and
    stays as it is (the other adapters serve), and nothing is rolled or deleted for it."""
    if not spec.lora_enabled:
        if obs.status.get("adapters") is not None or obs.status.get("adaptersReady") is not None:
            status.update(adapters=None, adaptersReady=None)  # null: the merge patch removes them
        if condition_of(obs.status, "AdaptersReady"):
            conds.set("AdaptersReady", "True", "NoAdapters", "the engine serves no LoRA adapters")
        return
    entries, summary, cond, warning = adapter_loading.status_of([a.name for a in spec.adapters or []], obs.adapters)
    status.update(adapters=entries, adaptersReady=summary)
    conds.set("AdaptersReady", *cond)
    if warning is not None:
        out.warnings.append(warning)


def _kv_events(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, out: Outcome) -> None:
    """spec.routing.picker kv-events: `KVEvents` says whether the router hears every engine's KV events
    (its oculis_kv_events_silent_replicas, read from Prometheus); a silent engine is scored from the
    router's prefix memory, so requests still flow: a warning, never a change to Ready."""
    if spec.routing is None or spec.routing.picker != "kv-events" or obs.kv_events_silent is None:
        return
    silent = int(obs.kv_events_silent)
    if silent:
        msg = (f"{silent} replica(s) publish no KV events the router hears; it scores them from its own prefix "
               "memory (picker prefix) meanwhile: check that the engine image supports --kv-events-config "
               "and that port 5557 is reachable from the router")
        conds.set("KVEvents", "False", "NoEvents", msg)
        out.warnings.append(("KVEventsFallback", msg))
    else:
        conds.set("KVEvents", "True", "Publishing", "the router hears every replica's KV events")


def _check_plan(obs: Observed, plan: capacity.Plan, conds: Conditions, status: dict[str, Any], out: Outcome) -> None:
    """Once every replica runs the planned engine: the KV cache it reports against the plan (status.capacity
    observedTokens/errorPercent), and CapacityOK reason PlanDrift above 5 %."""
    cap = status["capacity"]
    before = obs.status.get("capacity") or {}
    if obs.observed_kv_blocks is None:  # no reading this time: keep the last one for the same plan
        if before.get("observedTokens") is not None and before.get("plannedTokens") == plan.kv_cache_tokens:
            cap.update(observedTokens=before["observedTokens"], errorPercent=before.get("errorPercent"))
        else:
            return
    else:
        seen = capacity.observed_tokens(plan, obs.observed_kv_blocks)
        cap.update(observedTokens=seen, errorPercent=capacity.drift_percent(plan.kv_cache_tokens, seen))
    seen, err = cap["observedTokens"], cap["errorPercent"]
    if err is None or abs(err) <= capacity.DRIFT_PERCENT:
        return
    holds = seen >= plan.max_model_len and plan.max_num_seqs * plan.tokens_per_seq <= seen
    msg = (f"the engines report {seen} KV tokens, the plan {plan.kv_cache_tokens} ({err:+.1f} %, more than "
           f"{capacity.DRIFT_PERCENT:g} %): " + ("the observed cache still holds maxModelLen "
           f"{plan.max_model_len} and maxNumSeqs {plan.max_num_seqs} x {plan.tokens_per_seq} tokens" if holds else
           f"the observed cache cannot hold maxNumSeqs {plan.max_num_seqs} x {plan.tokens_per_seq} planned tokens "
           f"(or maxModelLen {plan.max_model_len}); lower maxNumSeqs to {seen // max(1, plan.tokens_per_seq)}") +
           "; compare with the engine's 'Available KV cache memory' log line (oculis capacity check --log)")
    conds.set("CapacityOK", "True" if holds else "False", "PlanDrift", msg)
    out.warnings.append(("PlanDrift", msg))


def unhostable(spec: GPUUpstreamSpec, nodes: rollout.Pool) -> tuple[str, str] | None:
    """(reason, message) when no node of the product can ever run a replica, or the replicas can never
    all run; None when they fit on the nodes' allocatable GPUs (were the nodes empty)."""
    assert spec.gpu is not None
    count, product = spec.gpu.count, spec.gpu.product
    gfd = gpus.lookup(product).gfd_product
    replicas = spec.replicas if spec.replicas is not None else 1
    fits = nodes.replicas_that_fit(count)
    if not nodes.allocatable:
        reason = "NoNodeCanHost"
        msg = (f"no node has {gpus.GPU_PRODUCT_LABEL}={gfd} ({product}), so no replica can be scheduled; its pods "
               "stay Pending until such a node joins: add a node pool of that product or change spec.gpu.product")
    elif count > max(nodes.allocatable):
        reason = "NoNodeCanHost"
        msg = (f"no node offers {count} {gpus.GPU_RESOURCE} of {product} ({gfd}): the largest of its "
               f"{len(nodes.allocatable)} nodes has {max(nodes.allocatable)}; lower spec.gpu.count to at most "
               f"{max(nodes.allocatable)} or add larger nodes")
    elif replicas > fits:
        reason = "ExceedsPool"
        msg = (f"replicas {replicas} x gpu.count {count} exceed what the {product} nodes can ever hold: "
               f"{len(nodes.allocatable)} nodes with {sum(nodes.allocatable)} {gpus.GPU_RESOURCE} in all fit at "
               f"most {fits} replicas, the other {replicas - fits} stay Pending; lower spec.replicas or add nodes")
    else:
        return None
    return reason, msg


def check(spec: GPUUpstreamSpec, model_config_text: str | None = None,
          model_config_problem: str | None = None) -> capacity.Plan | tuple[str, str]:
    """The capacity plan, or (reason, message) when the model or its draft cannot be planned at all.
    With spec.modelConfigFrom, `model_config_text` is the config.json the shell read (reason
    ModelConfigPending when it read none, as at admission, which cannot read ConfigMaps)."""
    assert spec.gpu is not None
    engine = spec.engine or Engine()
    inline = spec.model_config_
    if spec.model_config_from is not None:
        ref = spec.model_config_from.config_map_key_ref
        if model_config_problem:
            return "ModelConfigUnavailable", f"{capacity.UNKNOWN_MODEL}: {model_config_problem}"
        if model_config_text is None:
            return "ModelConfigPending", f"spec.modelConfigFrom: ConfigMap {ref.name!r} key {ref.key!r} not read yet"
        try:
            inline = hfconfig.parse(model_config_text, f"spec.modelConfigFrom (ConfigMap {ref.name}, key {ref.key})")
        except hfconfig.HFConfigError as exc:
            return "InvalidModelConfig", str(exc)
    try:
        model = catalog.lookup(spec.model, inline)
    except KeyError as exc:
        return "UnknownModel", f"{capacity.UNKNOWN_MODEL}: {exc.args[0]}"
    draft = None
    sp = engine.speculative
    # An EAGLE head is no draft model of the catalog (a layer or two on the target's hidden states): unplanned.
    if sp and sp.enabled and sp.draft_model and sp.method not in ("eagle", "eagle3"):
        try:
            draft = catalog.lookup(sp.draft_model)
        except KeyError as exc:
            return "UnknownModel", f"{capacity.UNKNOWN_MODEL}: speculative.draftModel: {exc.args[0]}"
        mismatch = capacity.draft_mismatch(model, draft, spec.model, sp.draft_model)
        if mismatch:
            return "TokenizerMismatch", mismatch
    # The budget terms changed across vLLM releases: plan for the version the engine image runs.
    return capacity.plan(model, gpus.lookup(spec.gpu.product), spec.gpu.count, engine, spec.traffic, draft,
                         spec.model, vllm_version=capacity.vllm_version(spec.image or engine_args.VLLM_IMAGE),
                         lora=spec.lora_enabled)


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
    running_hash = _template_hash(existing)
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


def _ann(obj: dict[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def _template_hash(dep: dict[str, Any]) -> str | None:
    return _ann(dep.get("spec", {}).get("template", {}), render.ENGINE_HASH)


def _speculation_guard(obs: Observed, spec: GPUUpstreamSpec, conds: Conditions, status: dict[str, Any], now: str,
                       warnings: list[tuple[str, str]]) -> GPUUpstreamSpec:
    """status.speculative from the measured acceptance, and the spec to plan and render: with speculation
    turned off by the guard for this generation, the same spec without it (its draft's memory goes back
    to the KV cache in the plan, and the change rolls like any other)."""
    sp = spec.engine.speculative if spec.engine else None
    prev = obs.status.get("speculative") or {}
    if sp is None or not sp.enabled:
        if condition_of(obs.status, "SpeculationDisabled"):
            conds.set("SpeculationDisabled", "False", "NotConfigured", "the spec runs no speculative decoding")
        return spec
    already = prev.get("disabledGeneration") == obs.generation
    window = obs.speculative_window_s
    v = speculative.decide(sp.acceptance_threshold, sp.auto_disable, obs.speculation, window, prev.get("lowSince"),
                           now, already)
    if v.decision == "Disabled":
        status["speculative"] = {**prev, "decision": "Disabled"}  # the figures that turned it off stay shown
        conds.set("SpeculationDisabled", "True", "LowAcceptance", str(prev.get("message") or v.message))
    else:
        status["speculative"] = {
            "acceptanceRate": None if v.acceptance_rate is None else round(v.acceptance_rate, 4),
            "meanAcceptedLength": None if v.mean_accepted_length is None else round(v.mean_accepted_length, 3),
            "draftTokens": v.draft_tokens, "window": f"{window}s", "decision": v.decision, "lowSince": v.low_since,
            "disabledGeneration": obs.generation if v.decision == "Disable" else None, "message": v.message}
        if v.decision == "Disable":
            conds.set("SpeculationDisabled", "True", "LowAcceptance", v.message)
            warnings.append(("SpeculationDisabled", v.message))
        else:
            conds.set("SpeculationDisabled", "False", v.decision, v.message)
            return spec
    assert spec.engine is not None
    off = sp.model_copy(update={"enabled": False})
    return spec.model_copy(update={"engine": spec.engine.model_copy(update={"speculative": off})})


def condition_of(status: dict[str, Any], type_: str) -> dict[str, Any]:
    found: dict[str, Any] = next((c for c in status.get("conditions", []) or [] if c.get("type") == type_), {})
    return found


# status.canary's keys and their value when unset; a key left out of a merge patch would keep the
# previous generation's figure (an earlier canary's failed intervals counted against the next).
CANARY_KEYS: dict[str, Any] = {"generation": None, "engineHash": None, "phase": None, "decision": None,
                               "startedAt": None, "lastCheckAt": None, "intervals": 0, "failedIntervals": 0,
                               "canaryRequests": None, "checks": [], "message": "", "summary": ""}


def _canary_gate(obs: Observed, spec: GPUUpstreamSpec, policy: Canary, desired: dict[str, Any], desired_hash: str,
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
    if cdep is not None and (_template_hash(cdep) != desired_hash or old_labels):  # an earlier change's canary
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


def _canary_conditions(existing: dict[str, Any] | None, held: tuple[str, str, str], conds: Conditions,
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
