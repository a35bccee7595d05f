"""kopf wiring for GPUUpstream: fetch, call the pure `reconcile`, write. Load with
`kopf run -m oculis_operator.handlers`.

Level-based and quiet: every GPUUpstream event, every event of a Deployment we own and the deletion
of a Service or PodDisruptionBudget we own lead to one reconcile of that upstream, which writes only
what differs. No kopf progress annotations: state
lives in status (GitOps tools replace annotations).

This module only registers with kopf; the bodies live in `upstream_sync` (one GPUUpstream),
`route_sync` (a namespace's InferenceRoutes into router ConfigMaps), `rechecks` (the loop) and
`metric_reads`, the environment it reads in `settings`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from oculis_operator import adapter_sync, render, rollout, router_configmap
from oculis_operator.admission import admission_verdict, admission_warning
from oculis_operator.kube import GROUP, PLURAL, VERSION, Kube, load_client
from oculis_operator.metrics import OperatorMetrics
from oculis_operator.rechecks import Prefixed, in_event_context, log, recheck, remember_event_context
from oculis_operator.route_sync import ROUTES, render_routes_or_recheck
from oculis_operator.settings import ADAPTER_SECONDS, WEBHOOK_PORT
from oculis_operator.upstream_sync import reconcile_named


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


@kopf.on.cleanup()
def report(memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    for task in (getattr(memo, "rechecks", None), getattr(memo, "adapter_sync", None)):
        if task is not None:
            task.cancel()
    # One line the scale benchmark reads: how many API requests the reconciles cost.
    logger.info(f"oculis totals: {memo.kube.reconciles} reconciles, {memo.kube.requests} API requests")


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


@kopf.on.event("", "v1", "configmaps", labels=router_configmap.LABELS)
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


def _only_status_moved(type: str | None, body: kopf.Body) -> bool:
    """A MODIFIED event whose spec we have already handled (same generation as observed)."""
    return type == "MODIFIED" and body.get("status", {}).get("observedGeneration") == body["metadata"].get("generation")
