"""Whether a GPUUpstream's spec can run: its KV-cache plan (the model, or its draft, resolved from the
catalog, spec.modelConfig or a config.json), whether its GPU pool can ever host the replicas, and
once they run whether the KV cache the engines report matches the plan. Pure: no API calls.
"""

from __future__ import annotations

from typing import Any

from oculis import gpus
from oculis.engine import Engine
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import capacity, catalog, engine_args, hfconfig, rollout
from oculis_operator.conditions import Conditions
from oculis_operator.reconcile_io import Observed, Outcome

# CapacityOK reasons say what was refused, per error code of the plan.
REFUSAL_REASONS = {capacity.KV_EXHAUSTED: "KVCacheExhausted", capacity.TP_MISMATCH: "TensorParallelHeads"}


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


def check_observed(obs: Observed, plan: capacity.Plan, conds: Conditions, status: dict[str, Any], out: Outcome) -> None:
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
