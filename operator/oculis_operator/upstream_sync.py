"""Reconciles one GPUUpstream by name, in the operator's I/O shell: reads what `reconcile` needs (the
workload, Secrets, config.json, metrics), calls it, writes what differs, and reports each change and
problem once as an Event.
"""

from __future__ import annotations

import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import hfconfig, promquery, reconcile_io, render, rollout, speculative
from oculis_operator import reconcile as core
from oculis_operator.access_sync import ensure_key, sync_policy
from oculis_operator.api_errors import api_error_line, going_away
from oculis_operator.conditions import condition, status_changed, utc_now
from oculis_operator.kube import Kube
from oculis_operator.metric_reads import autoscale_decision, read_canary, read_speculation
from oculis_operator.metrics import OperatorMetrics
from oculis_operator.route_sync import render_routes_or_recheck
from oculis_operator.settings import NETWORK_POLICY, PROMETHEUS_URL, RECHECK_SECONDS, SPECULATIVE_WINDOW_SECONDS

WAITING_REASONS = {"SecretNotFound", "SecretKeyMissing"}


def reconcile_named(memo: kopf.Memo, namespace: str, name: str, logger: kopf.Logger) -> None:
    """Reconcile one upstream at a time: its own events and its Deployment's arrive concurrently, and
    each must start from the status the previous one wrote, so it is read inside the lock."""
    kube: Kube = memo.kube
    metrics: OperatorMetrics = memo.metrics
    with kube.lock_for(namespace, name):
        upstream = None
        try:
            upstream = kube.upstream(namespace, name)
            if upstream is None or upstream["metadata"].get("deletionTimestamp"):
                kube.recheck.discard((namespace, name))
                kube.external.discard((namespace, name))
                kube.last_failure.pop((namespace, name), None)
                kube.reported.pop((namespace, name), None)
                forget_adapters(kube, (namespace, name))
                metrics.observe_upstream((namespace, name), None)
                return
            reconcile_one(kube, upstream, logger, metrics)
            metrics.reconciles.labels("ok").inc()
        except (ApiException, HTTPError) as err:
            metrics.reconciles.labels("failed").inc()
            # One line, no traceback: the cause is the API's answer; the recheck loop tries again
            # (and drops the upstream once it is gone).
            kube.recheck.add((namespace, name))
            if going_away(err):  # its namespace is being deleted: nothing to tell anyone
                return
            line = f"reconcile failed, retrying every {RECHECK_SECONDS:g} s: {api_error_line(err)}"
            if kube.last_failure.get((namespace, name)) != line:  # say it once, not every recheck
                kube.last_failure[(namespace, name)] = line
                logger.warning(line)
                if upstream is not None:  # shown by `kubectl describe gu`
                    kopf.warn(kopf.Body(upstream), reason="ReconcileFailed", message=line)  # type: ignore[arg-type]
            return
        finally:
            metrics.retrying.set(len(kube.recheck))
        kube.last_failure.pop((namespace, name), None)


def reconcile_one(kube: Kube, upstream: dict[str, Any], logger: kopf.Logger, metrics: OperatorMetrics) -> None:
    kube.reconciles += 1
    meta = upstream["metadata"]
    ns, name = meta["namespace"], meta["name"]
    spec, status = upstream.get("spec", {}), upstream.get("status", {}) or {}
    external = spec.get("provider") != "vllm"
    ref = spec.get("apiKeySecretRef") or {}
    dep = None if external else kube.deployment(ns, name)
    rolling = dep is not None and not rollout.progress(dep).complete
    service = None if external else kube.service(ns, name)
    pdb = None if external else kube.pdb(ns, name)
    config_text, config_problem = (None, None) if external else hfconfig.config_map_text(
        spec, lambda cm: kube.config_map(ns, cm), ns)
    sp_spec = (spec.get("engine") or {}).get("speculative") or {}
    guarded = not external and bool(sp_spec) and sp_spec.get("enabled", True) is not False
    speculation = read_speculation(ns, name) if guarded and dep is not None and PROMETHEUS_URL else None
    wants_canary = not external and ((spec.get("rollout") or {}).get("strategy") == "Canary"
                                     or bool(status.get("canary")))
    cdep = kube.canary_deployment(ns, name) if wants_canary else None
    canary_svc = wants_canary and kube.canary_service(ns, name) is not None
    samples = read_canary(ns, name, spec, status.get("canary") or {}) if (
        cdep is not None and rollout.progress(cdep).complete) else None
    scaled = None if external else autoscale_decision(kube, spec, status, dep, ns, name)
    kv_events = not external and (spec.get("routing") or {}).get("picker") == "kv-events"
    register_adapters(kube, (ns, name), spec)
    obs = reconcile_io.Observed(
        name=name, namespace=ns, uid=meta["uid"], generation=meta.get("generation", 1), spec=spec, status=status,
        deployment=dep,
        has_service=external or service is not None,
        has_pdb=external or pdb is not None,
        secret=kube.secret_state(ns, ref["name"], ref.get("key", "api-key")) if external and ref.get("name") else None,
        pending_reasons=kube.pending_reasons(ns, name) if rolling else [],
        service=service, pdb=pdb, model_config_text=config_text, model_config_problem=config_problem,
        observed_kv_blocks=promquery.prometheus_kv_blocks(PROMETHEUS_URL, ns, name) if dep is not None else None,
        speculation=speculation, speculative_window_s=SPECULATIVE_WINDOW_SECONDS,
        canary_deployment=cdep, has_canary_service=canary_svc, canary_samples=samples, autoscale=scaled,
        kv_events_silent=promquery.prometheus_value(PROMETHEUS_URL, promquery.kv_events_silent_query(ns, name))
        if kv_events and PROMETHEUS_URL else None,
        adapters=kube.adapter_reports.get((ns, name)),
    )

    def spare(product: str) -> int:
        nodes, pods = kube.gpu_nodes_and_pods(product)
        return rollout.spare_gpus(nodes, pods, product)

    def pool(product: str) -> rollout.Pool:
        return rollout.pool(kube.gpu_nodes(product), product)

    out = core.reconcile(obs, spare, utc_now(), pool)
    ready = condition(out.status, "Ready")
    metrics.observe_upstream((ns, name), ready.get("status") == "True")
    refused, before = condition(out.status, "CapacityOK"), condition(status, "CapacityOK")
    new_change = status.get("observedGeneration") != out.status.get("observedGeneration")
    if refused.get("status") == "False" and (before.get("status") != "False" or new_change):
        metrics.refusals.labels(refused.get("reason", "")).inc()  # once per refused change, not per reconcile
    # Ready but the engines' KV cache not seen yet (Prometheus scrapes after the pods start): look again.
    awaiting_kv = bool(PROMETHEUS_URL) and not external and ready.get("status") == "True" and (
        out.status.get("capacity") or {}).get("observedTokens") is None
    if speculation is not None:
        metrics.observe_speculation((ns, name), speculative.rates(speculation)[0], speculation.accepted_total)
    # Measurements move without any Kubernetes event: a canary under analysis (or waiting for GPUs) and
    # an auto-disabling speculation guard are looked at again every recheck.
    canary_open = (out.status.get("canary") or {}).get("phase") in ("Analyzing", "WaitingForGPUs")
    guard_open = guarded and bool(sp_spec.get("autoDisable")) and bool(PROMETHEUS_URL) and (
        out.status.get("speculative") or {}).get("decision") != "Disabled"
    # An autoscaled upstream's load moves without any Kubernetes event: evaluated every recheck round.
    autoscaled = scaled is not None
    # kv-events: whether the router hears the engines moves without any Kubernetes event (KVEvents condition).
    heard = kv_events and bool(PROMETHEUS_URL)
    if (external and ready.get("reason") in WAITING_REASONS) or awaiting_kv or canary_open or guard_open or autoscaled \
            or heard:
        kube.recheck.add((ns, name))
    else:
        kube.recheck.discard((ns, name))
    if external and ref.get("name"):
        kube.external.add((ns, name))
    else:
        kube.external.discard((ns, name))
    # The status first: if a write below is refused, it must not keep saying Ready (the write is
    # retried and reported as ReconcileFailed).
    if status_changed(status, out.status):
        kube.patch_status(ns, name, out.status)
        if status_changed(for_routes(status), for_routes(out.status)):
            render_routes_or_recheck(kube, ns, logger)  # readiness and engine hash feed the router config
    parsed = None if external else spec_or_none(spec)
    if parsed is not None and (out.create or dep is not None):
        # The key before the Deployment that reads it (a pod without it would not start), and the policy.
        for line in (ensure_key(kube, ns, name, meta["uid"]) if parsed.engine_api_key else None,
                     sync_policy(kube, ns, name, meta["uid"], parsed, NETWORK_POLICY)):
            if line:
                out.log.append(line)
    for body in out.create:
        kube.create(body)
    if not external and kube.apply_inference_pool(render.inference_pool(name, ns, meta["uid"]),
                                                  time.monotonic()) == "applied":
        logger.info(f"InferencePool {render.workload_name(name)} applied (Gateway API Inference Extension)")
    if out.delete_canary:
        kube.delete_canary(ns, name)
    if out.deployment_patch is not None:
        kube.patch_deployment(ns, name, out.deployment_patch)
    for kind, patch in (("Service", out.service_patch), ("PodDisruptionBudget", out.pdb_patch)):
        if patch is not None:
            kube.patch_workload(kind, ns, name, patch)
    for line in out.log + kube.adapter_log.pop((ns, name), []):
        logger.info(line)
        kopf.info(kopf.Body(upstream), reason="Reconciled", message=line[:1000])  # type: ignore[arg-type]
    # Each problem once while it lasts (reconciles repeat on every Deployment event), again if it recurs.
    before_warnings, now_warnings = kube.reported.get((ns, name), {}), dict(out.warnings)
    for reason, message in now_warnings.items():
        if before_warnings.get(reason) != message:
            logger.warning(message)
            kopf.warn(kopf.Body(upstream), reason=reason, message=message[:1000])  # type: ignore[arg-type]
    kube.reported[(ns, name)] = now_warnings


def spec_or_none(spec: dict[str, Any]) -> GPUUpstreamSpec | None:
    """The parsed spec, or None when invalid (the reconcile reports why)."""
    try:
        return GPUUpstreamSpec.model_validate(spec)
    except ValidationError:
        return None


def register_adapters(kube: Kube, key: tuple[str, str], spec: dict[str, Any]) -> None:
    """An upstream whose engines serve LoRA is visited by the adapter sync (adapter_sync.run) with its spec;
    one that stopped (or whose spec is invalid: the reconcile reports it) is not."""
    parsed = spec_or_none(spec)
    if parsed is not None and parsed.lora_enabled:
        before = kube.lora_upstreams.get(key)
        kube.lora_upstreams[key] = parsed
        if kube.adapter_wake is not None and (before is None or before.adapters != parsed.adapters):
            kube.adapter_wake()  # load or unload now rather than at the next period
    else:
        forget_adapters(kube, key)


def forget_adapters(kube: Kube, key: tuple[str, str]) -> None:
    kube.lora_upstreams.pop(key, None)
    kube.adapter_reports.pop(key, None)
    kube.adapter_log.pop(key, None)


def for_routes(status: dict[str, Any]) -> dict[str, Any]:
    """The status less what an autoscaler rewrites every evaluation (its figures, ScalingActive's message),
    which no router config reads: a busy autoscaled upstream must not re-render its routes every round."""
    out = {k: v for k, v in status.items() if k != "autoscaling"}
    out["conditions"] = [c for c in status.get("conditions", []) if c.get("type") != "ScalingActive"]
    return out
