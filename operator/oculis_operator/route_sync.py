"""Renders a namespace's InferenceRoutes (with the GPUUpstreams they name) into the router ConfigMaps
and writes each route's status; a failed write is retried by the recheck loop.
"""

from __future__ import annotations

from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from urllib3.exceptions import HTTPError

from oculis.inferenceroute import ClassifierDriftAlarm
from oculis_operator import classifier_drift, promquery, routeconfig, router_configmap
from oculis_operator.api_errors import api_error_line, going_away
from oculis_operator.conditions import Conditions, status_changed, utc_now
from oculis_operator.kube import PLURAL, Kube
from oculis_operator.settings import PROMETHEUS_URL, RECHECK_SECONDS

ROUTES = "inferenceroutes"
DRIFT_NAMESPACES: set[str] = set()  # namespaces with a route whose classifierDrift is watched


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
        live = {cm["metadata"]["name"]: cm for cm in kube.config_maps(namespace, router_configmap.SELECTOR)}
        if not routes and not live:
            return
        # What the operator last wrote: a route whose upstream vanished keeps its last good block.
        previous = {cm: data for cm, obj in live.items() if (data := router_configmap.written_data(obj)) is not None}
        desired = (routeconfig.render_config_maps(routes, kube.list_custom(namespace, PLURAL), previous)
                   if routes else {})
        for cm, out in desired.items():
            current = live[cm] if cm in live else kube.config_map(namespace, cm)  # ours, unlabelled by hand?
            why = routeconfig.config_map_drift(current, out)
            if why is None:
                continue
            kube.apply_config_map(namespace, cm, out.data, {router_configmap.HASH_ANNOTATION: out.digest},
                                  exists=current is not None, labels=router_configmap.LABELS, owners=out.owners)
            logger.info(f"Rendered router config {cm} ({out.digest}): {why}")
            if why.startswith("edited by hand") or why.startswith("labels"):
                for route in routes:
                    if router_configmap.config_map_of(route) == cm:
                        kopf.warn(route, reason="ConfigMapReverted",  # type: ignore[arg-type]
                                  message=f"ConfigMap {cm} was {why}; rewritten from the routes that name it")
        for cm in sorted(live.keys() - desired.keys()):
            # The last route naming it went away or names another ConfigMap: the router must stop
            # serving them (garbage collection does the same when the last owner is deleted).
            kube.delete_config_map(namespace, cm)
            logger.info(f"Deleted router config {cm}: no InferenceRoute names it any more")
        now = utc_now()
        watched = False
        for route in routes:
            meta, status = route["metadata"], route.get("status") or {}
            cm = router_configmap.config_map_of(route)
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
            traffic = classifier_drift_status(namespace, meta["name"], (route.get("spec") or {}).get("classifierDrift"),
                                        conds)
            watched = watched or (route.get("spec") or {}).get("classifierDrift") is not None
            up = verdict.named_ready  # the tiers' upstreams and the verifier's
            new = {"observedGeneration": meta.get("generation", 1), "conditions": conds.items, "tiers": verdict.tiers,
                   "tierStatus": verdict.tier_status, "strategy": verdict.strategy or None,
                   "upstreamsReady": f"{sum(up.values())}/{len(up)}" if up else None,
                   "configMap": cm, "configHash": rendered.digest}
            if traffic is not None:
                new["traffic"] = traffic
            if status_changed(status, new):
                kube.patch_status(namespace, meta["name"], new, ROUTES)
        # Traffic moves without any Kubernetes event: namespaces with a watched route are re-rendered
        # every recheck round (the render writes nothing when nothing changed).
        (DRIFT_NAMESPACES.add if watched and PROMETHEUS_URL else DRIFT_NAMESPACES.discard)(namespace)


def classifier_drift_status(namespace: str, route: str, alarm: dict[str, Any] | None,
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
