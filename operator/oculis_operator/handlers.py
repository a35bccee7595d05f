"""kopf wiring for GPUUpstream: fetch, call the pure `reconcile`, write. Load with
`kopf run -m oculis_operator.handlers`.

Level-based and quiet: every GPUUpstream event, every event of a Deployment we own and the deletion
of a Service or PodDisruptionBudget we own lead to one reconcile of that upstream, which writes only
what differs. No kopf progress annotations: state
lives in status (GitOps tools replace annotations). Environment:
  OCULIS_RECHECK_SECONDS (default 10): how often upstreams are reconciled again, by name, when their
  last reconcile failed on an API error (kopf does not retry event handlers) or they wait for an
  API-key Secret; every 6th round also every external upstream, so a Secret deleted or emptied
  after the fact turns it not Ready. Polling those few by name needs only `get` on Secrets;
  watching Secrets would need cluster-wide list/watch on every Secret, which least privilege rules out.
  OCULIS_METRICS_PORT (+ _ADDR): serve the operator's Prometheus metrics (`oculis_operator_*`).
  OCULIS_WEBHOOK_PORT (+ _ADDR, _HOST, _CERT, _KEY, _CA): serve the validating webhook, which
  refuses at apply time a change whose single sequence or weights cannot fit.
  OCULIS_ADAPTER_SECONDS (default 5): how often the LoRA adapters of each upstream serving LoRA are
  compared with what its engines hold and loaded/unloaded (adapter_sync); OCULIS_ENGINE_ENDPOINTS=FILE:
  reach engine pods at the 127.0.0.1 ports of the pod stand-in's endpoint map instead of their pod IPs.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime
import functools
import logging
import os
import time
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from oculis import gpus
from oculis.autoscaling import Autoscaling
from oculis.formats import duration_seconds
from oculis.inferenceroute import ClassifierDriftAlarm
from oculis.placement import GPU
from oculis.rollout import Canary
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import (
    adapter_sync,
    autoscale,
    canary,
    classifier_drift,
    hfconfig,
    promquery,
    reconcile_io,
    render,
    rollout,
    routeconfig,
    speculative,
)
from oculis_operator import reconcile as core
from oculis_operator.admission import admission_verdict, admission_warning
from oculis_operator.api_errors import api_error_line, going_away
from oculis_operator.conditions import Conditions, condition
from oculis_operator.kube import GROUP, PLURAL, VERSION, Kube, load_client
from oculis_operator.metrics import OperatorMetrics

ROUTES = "inferenceroutes"
WEBHOOK_PORT = os.environ.get("OCULIS_WEBHOOK_PORT")
RECHECK_SECONDS = float(os.environ.get("OCULIS_RECHECK_SECONDS", "10"))
# Where the engines' vllm:cache_config_info is scraped, to compare the KV plan with what vLLM got; unset: no check.
PROMETHEUS_URL = os.environ.get("OCULIS_PROMETHEUS_URL", "")
# The window over which the router's demand for an upstream is counted (a request in it wakes an upstream
# at zero and keeps one from counting as idle).
AUTOSCALE_DEMAND_WINDOW_SECONDS = float(os.environ.get("OCULIS_AUTOSCALE_DEMAND_WINDOW_SECONDS", "60"))
DRIFT_NAMESPACES: set[str] = set()  # namespaces with a route whose classifierDrift is watched
# The speculative-decoding guard's window: acceptance is judged over this many seconds.
SPECULATIVE_WINDOW_SECONDS = int(os.environ.get("OCULIS_SPECULATIVE_WINDOW_SECONDS", "300"))
ADAPTER_SECONDS = float(os.environ.get("OCULIS_ADAPTER_SECONDS", "5"))  # the LoRA adapter sync's period
WAITING_REASONS = {"SecretNotFound", "SecretKeyMissing"}
EXTERNAL_EVERY = 6  # recheck rounds between looks at every external upstream's Secret
log = logging.getLogger("oculis.operator")


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Normal events (Created, Rolling, Scaled, Reverted) are posted; log lines are not, so each
    # event is the one kopf.info/kopf.warn call that means it.
    settings.posting.level = logging.INFO
    settings.posting.loggers = False
    settings.watching.server_timeout = 300
    memo.metrics = OperatorMetrics()
    # Shared: kopf gives each object a shallow copy of this memo.
    memo.kube = Kube(load_client(), on_request=memo.metrics.api_requests.inc)
    if os.environ.get("OCULIS_METRICS_PORT"):
        memo.metrics.serve(int(os.environ["OCULIS_METRICS_PORT"]), os.environ.get("OCULIS_METRICS_ADDR", "0.0.0.0"))
    if WEBHOOK_PORT:
        settings.admission.server = kopf.WebhookServer(
            addr=os.environ.get("OCULIS_WEBHOOK_ADDR", "0.0.0.0"), port=int(WEBHOOK_PORT),
            host=os.environ.get("OCULIS_WEBHOOK_HOST"), certfile=os.environ.get("OCULIS_WEBHOOK_CERT"),
            pkeyfile=os.environ.get("OCULIS_WEBHOOK_KEY"), cafile=os.environ.get("OCULIS_WEBHOOK_CA"))
        settings.admission.managed = "oculis.dev"


@kopf.on.startup()
async def start_rechecks(memo: kopf.Memo, **_: Any) -> None:
    # A task created here inherits kopf's context, so events can still be posted from it.
    memo.rechecks = asyncio.create_task(recheck(memo))

    async def adapters_changed(namespace: str, name: str) -> None:
        named = Prefixed(log, {"obj": f"{namespace}/{name}"})
        await in_event_context(memo.kube, functools.partial(reconcile_named, memo, namespace, name, named))

    memo.adapter_sync = asyncio.create_task(adapter_sync.run(memo.kube, adapters_changed, ADAPTER_SECONDS))


async def in_event_context(kube: Kube, call: Any) -> None:
    """Run a reconcile from a startup task in a thread, in a handler's context: kopf sets its event queue
    only in an object's handler, not in a startup task; without it kopf.info/warn raised LookupError here,
    so a recheck posted no Event and stopped before its warnings (a canary's rollback among them)."""
    ctx = kube.event_context
    await asyncio.to_thread(ctx.copy().run, call) if ctx is not None else await asyncio.to_thread(call)


async def recheck(memo: kopf.Memo) -> None:
    """Reconcile again, by name, the upstreams whose last reconcile failed or waits for a Secret, and
    the namespaces whose router config could not be written."""
    kube: Kube = memo.kube
    rounds = 0
    while True:
        await asyncio.sleep(RECHECK_SECONDS)
        rounds += 1
        due = kube.recheck | (kube.external if rounds % EXTERNAL_EVERY == 0 else set())
        for namespace, name in sorted(due):
            with contextlib.suppress(Exception):  # one failing upstream must not stop the others
                named = Prefixed(log, {"obj": f"{namespace}/{name}"})
                await in_event_context(kube, functools.partial(reconcile_named, memo, namespace, name, named))
        for namespace in sorted(kube.recheck_routes | DRIFT_NAMESPACES):
            with contextlib.suppress(Exception):
                await asyncio.to_thread(render_routes_or_recheck, kube, namespace, log, True)


class Prefixed(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Names the object in lines logged outside a kopf handler, as kopf's own logger does."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{(self.extra or {}).get('obj')}] {msg}", kwargs


@kopf.on.cleanup()
def report(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    for task in (getattr(memo, "rechecks", None), getattr(memo, "adapter_sync", None)):
        if task is not None:
            task.cancel()
    # One line the scale benchmark reads: how many API requests the reconciles cost.
    logger.info(f"oculis totals: {memo.kube.reconciles} reconciles, {memo.kube.requests} API requests")


def remember_event_context(kube: Kube) -> None:
    """Keep a handler's context (kopf's event queue is in it) for the recheck loop's reconciles."""
    if kube.event_context is None:
        kube.event_context = contextvars.copy_context()


@kopf.on.event(GROUP, VERSION, PLURAL)
def upstream_event(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    remember_event_context(memo.kube)
    if type == "DELETED":
        # Owner references garbage-collect the workload; the routes over it must leave the config.
        render_routes_or_recheck(memo.kube, body["metadata"]["namespace"], logger)
        return
    if _only_status_moved(type, body):
        return  # often our own write; the Deployment's events carry rollout progress
    reconcile_named(memo, body["metadata"]["namespace"], body["metadata"]["name"], logger)


@kopf.on.event("apps", "v1", "deployments", labels={render.UPSTREAM_LABEL: kopf.PRESENT})
def deployment_event(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    # Also on DELETED: a Deployment removed by hand is recreated while its GPUUpstream exists.
    reconcile_named(memo, body["metadata"]["namespace"], body["metadata"]["labels"][render.UPSTREAM_LABEL], logger)


@kopf.on.event("", "v1", "services", labels={render.UPSTREAM_LABEL: kopf.PRESENT})
@kopf.on.event("policy", "v1", "poddisruptionbudgets", labels={render.UPSTREAM_LABEL: kopf.PRESENT})
def owned_object_event(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    # A deletion (by hand, or by garbage collection after the upstream went) or an edit: the reconcile
    # recreates or reverts what its upstream still needs, and does nothing if the upstream is gone.
    meta = body["metadata"]
    key = (body.get("kind", ""), meta["namespace"], meta["name"])
    generation = meta.get("generation")
    if type == "DELETED":
        _seen_generation.pop(key, None)
    elif body.get("kind") == "PodDisruptionBudget":
        # A PDB's status moves with every pod; only a new spec (generation) can be a hand edit.
        if type is None or _seen_generation.get(key, generation) == generation:
            _seen_generation[key] = generation
            return
        _seen_generation[key] = generation
    elif type != "MODIFIED":
        return  # listed at start or just created: the Deployment's events reconcile the upstream anyway
    reconcile_named(memo, meta["namespace"], meta["labels"][render.UPSTREAM_LABEL], logger)


_seen_generation: dict[tuple[str, str, str], Any] = {}  # PodDisruptionBudgets' last seen metadata.generation


@kopf.on.event(GROUP, VERSION, ROUTES)
def route_event(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    if _only_status_moved(type, body):
        return  # our own status write
    render_routes_or_recheck(memo.kube, body["metadata"]["namespace"], logger, sweep=True)


def render_routes_or_recheck(kube: Kube, namespace: str, logger: kopf.Logger, sweep: bool = False) -> None:
    try:
        render_routes(kube, namespace, logger, sweep)
        kube.recheck_routes.discard(namespace)
    except (ApiException, HTTPError) as err:
        if going_away(err):
            return
        kube.recheck_routes.add(namespace)
        logger.warning(f"Rendering the router config of {namespace} failed, retrying in {RECHECK_SECONDS:g} s: "
                       f"{api_error_line(err)}")


def render_routes(kube: Kube, namespace: str, logger: kopf.Logger, sweep: bool = False) -> None:
    """Make each router ConfigMap of the namespace equal the routes that name it (written only when
    the live one differs, hand edits included; deleted when no route names it), then the statuses.
    `sweep`: also when the namespace has no route (a route or ConfigMap event: one may be left over);
    an upstream's change in a namespace without routes costs one list, not two."""
    with kube.lock_for(namespace, "\x00routes"):
        routes = kube.list_custom(namespace, ROUTES)
        if not routes and not sweep:
            return
        live = {cm["metadata"]["name"]: cm for cm in kube.config_maps(namespace, routeconfig.SELECTOR)}
        if not routes and not live:
            return
        # What the operator last wrote: a route whose upstream vanished keeps its last good block.
        previous = {cm: data for cm, obj in live.items() if (data := routeconfig.written_data(obj)) is not None}
        desired = (routeconfig.render_config_maps(routes, kube.list_custom(namespace, PLURAL), previous)
                   if routes else {})
        for cm, out in desired.items():
            current = live[cm] if cm in live else kube.config_map(namespace, cm)  # ours, unlabelled by hand?
            why = routeconfig.config_map_drift(current, out)
            if why is None:
                continue
            kube.apply_config_map(namespace, cm, out.data, {routeconfig.HASH_ANNOTATION: out.digest},
                                  exists=current is not None, labels=routeconfig.LABELS, owners=out.owners)
            logger.info(f"Rendered router config {cm} ({out.digest}): {why}")
            if why.startswith("edited by hand") or why.startswith("labels"):
                for route in routes:
                    if routeconfig.config_map_of(route) == cm:
                        kopf.warn(route, reason="ConfigMapReverted",  # type: ignore[arg-type]
                                  message=f"ConfigMap {cm} was {why}; rewritten from the routes that name it")
        for cm in sorted(live.keys() - desired.keys()):
            # The last route naming it went away or names another ConfigMap: the router must stop
            # serving them (garbage collection does the same when the last owner is deleted).
            kube.delete_config_map(namespace, cm)
            logger.info(f"Deleted router config {cm}: no InferenceRoute names it any more")
        now = _now()
        watched = False
        for route in routes:
            meta, status = route["metadata"], route.get("status") or {}
            cm = routeconfig.config_map_of(route)
            rendered = desired.get(cm)
            verdict = rendered.routes.get(meta["name"]) if rendered else None
            if rendered is None or verdict is None:
                continue
            conds = Conditions(status.get("conditions", []), meta.get("generation", 1), now)
            conds.set("Ready", "True" if verdict.ready else "False", verdict.reason, verdict.message)
            # Degraded and Progressing, as a GPUUpstream has, so GitOps health (Argo CD) can tell a
            # broken route from one still coming up.
            conds.set("Degraded", *(("True", verdict.reason, verdict.message) if verdict.degraded
                                    else ("False", "AsExpected", "")))
            conds.set("Progressing", *(("True", "WaitingForUpstreams", verdict.progressing) if verdict.progressing
                                       else ("False", "Settled", "")))
            traffic = _classifier_drift(namespace, meta["name"], (route.get("spec") or {}).get("classifierDrift"),
                                        conds)
            watched = watched or (route.get("spec") or {}).get("classifierDrift") is not None
            up = verdict.named_ready  # the tiers' upstreams and the verifier's
            new = {"observedGeneration": meta.get("generation", 1), "conditions": conds.items, "tiers": verdict.tiers,
                   "tierStatus": verdict.tier_status, "strategy": verdict.strategy or None,
                   "upstreamsReady": f"{sum(up.values())}/{len(up)}" if up else None,
                   "configMap": cm, "configHash": rendered.digest}
            if traffic is not None:
                new["traffic"] = traffic
            if _status_changed(status, new):
                kube.patch_status(namespace, meta["name"], new, ROUTES)
        # Traffic moves without any Kubernetes event: namespaces with a watched route are re-rendered
        # every recheck round (the render writes nothing when nothing changed).
        (DRIFT_NAMESPACES.add if watched and PROMETHEUS_URL else DRIFT_NAMESPACES.discard)(namespace)


@kopf.on.event("", "v1", "configmaps", labels=routeconfig.LABELS)
def router_config_event(type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger,
                        **_: Any) -> None:
    # A router ConfigMap edited or deleted by hand is rewritten from the routes; after our own
    # write this renders once more and finds nothing to do.
    render_routes_or_recheck(memo.kube, body["metadata"]["namespace"], logger, sweep=True)


if WEBHOOK_PORT:
    @kopf.on.validate(GROUP, VERSION, PLURAL, operations=["CREATE", "UPDATE"])
    def validate(spec: kopf.Spec, body: kopf.Body, memo: kopf.Memo, warnings: list[str], **_: Any) -> None:
        refusal = admission_verdict(dict(spec), (body.get("metadata") or {}).get("name"))
        if refusal:
            raise kopf.AdmissionError(refusal, code=422)
        with contextlib.suppress(ApiException, HTTPError):  # a warning is advice: never block an apply for it
            warning = admission_warning(dict(spec), lambda product: rollout.pool(memo.kube.gpu_nodes(product),
                                                                                 product))
            if warning:
                warnings.append(warning)


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
    scaled = None if external else _autoscale(kube, spec, status, dep, ns, name)
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

    out = core.reconcile(obs, spare, _now(), pool)
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
    if _status_changed(status, out.status):
        kube.patch_status(ns, name, out.status)
        if _status_changed(_for_routes(status), _for_routes(out.status)):
            render_routes_or_recheck(kube, ns, logger)  # readiness and engine hash feed the router config
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


def register_adapters(kube: Kube, key: tuple[str, str], spec: dict[str, Any]) -> None:
    """An upstream whose engines serve LoRA is visited by the adapter sync (adapter_sync.run) with its spec;
    one that stopped (or whose spec is invalid: the reconcile reports it) is not."""
    try:
        parsed = GPUUpstreamSpec.model_validate(spec)
    except ValidationError:
        parsed = None
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
    if not canary.due(status, policy, _now()):
        return None
    window = max(1, duration_seconds(policy.interval))
    read = {track: canary.sample({k: promquery.prometheus_value(PROMETHEUS_URL, q)
                                  for k, q in canary.queries(namespace, name, track, window).items()})
            for track in ("canary", "stable")}
    return read["canary"], read["stable"]


def _autoscale(kube: Kube, spec: dict[str, Any], status: dict[str, Any], dep: dict[str, Any] | None, ns: str,
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


def _classifier_drift(namespace: str, route: str, alarm: dict[str, Any] | None,
                      conds: Conditions) -> dict[str, Any] | None:
    """spec.classifierDrift: the router's counters over both windows from Prometheus -> the
    ClassifierDrift condition (set on `conds`) and status.traffic; None (both left as they were) when
    the route is not watched or Prometheus gave nothing."""
    if alarm is None or not PROMETHEUS_URL:
        return None
    try:
        spec = ClassifierDriftAlarm.model_validate(alarm)
    except ValidationError:
        return None  # refused at apply by the CRD schema; a stored older object is just not watched
    verdict = classifier_drift.evaluate(
        lambda q: promquery.prometheus_result(PROMETHEUS_URL, q), namespace, route,
        classifier_drift.window_seconds(spec.short_window), classifier_drift.window_seconds(spec.long_window),
        classifier_drift.DriftPolicy(factor=spec.factor, min_requests=spec.min_requests))
    if verdict is None:
        return None
    conds.set("ClassifierDrift", verdict.status, verdict.reason, verdict.message)
    return verdict.traffic


def _for_routes(status: dict[str, Any]) -> dict[str, Any]:
    """The status less what an autoscaler rewrites every evaluation (its figures, ScalingActive's message),
    which no router config reads: a busy autoscaled upstream must not re-render its routes every round."""
    out = {k: v for k, v in status.items() if k != "autoscaling"}
    out["conditions"] = [c for c in status.get("conditions", []) if c.get("type") != "ScalingActive"]
    return out


def _only_status_moved(type: str | None, body: kopf.Body) -> bool:
    """A MODIFIED event whose spec we have already handled (same generation as observed)."""
    return type == "MODIFIED" and body.get("status", {}).get("observedGeneration") == body["metadata"].get("generation")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())
