"""The canary's share of the traffic is the router's, not the Service's: the canary pods have their own
labels and Service, the stable Service, Deployment and PodDisruptionBudget never select them, and the
router config names the canary Service with spec.rollout.canary.trafficPercent only while the canary
is analysed with its replicas up. Pure: render, reconcile and routeconfig on the real status shape."""

from __future__ import annotations

import copy
from typing import Any

from test_canary_reconcile import CHANGED, GOOD, SLOW, complete, stable_world

from oculis import parse_config
from oculis_operator import render, routeconfig, router_configmap
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z", "2026-01-01T00:00:15Z"
SPLIT = {**CHANGED, "rollout": {**CHANGED["rollout"], "canary": {**CHANGED["rollout"]["canary"],
                                                                  "trafficPercent": 40}}}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def step(status: dict[str, Any], dep: dict[str, Any], now: str, cdep: dict[str, Any] | None = None,
         samples: Any = None, has_service: bool | None = None, spec: dict[str, Any] = SPLIT) -> Any:
    return reconcile(Observed("x", "ns", "uid", 2, spec, status, dep, canary_deployment=cdep,
                              has_canary_service=cdep is not None if has_service is None else has_service,
                              canary_samples=samples), lambda p: 8, now)


def upstream_obj(status: dict[str, Any], spec: dict[str, Any] = SPLIT) -> dict[str, Any]:
    return {"metadata": {"name": "x", "namespace": "ns", "generation": 2}, "spec": spec, "status": status}


def rendered_canary(status: dict[str, Any], spec: dict[str, Any] = SPLIT) -> Any:
    """The router's view of upstream x as the operator renders it for a route over it."""
    route = {"metadata": {"name": "r", "namespace": "ns", "generation": 1},
             "spec": {"tiers": [{"name": "t", "upstream": "x"}]}}
    out = routeconfig.render_namespace([route], [upstream_obj(status, spec)])
    assert out.routes["r"].reason in ("Rendered", "UpstreamProgressing"), out.routes["r"]
    return parse_config(out.data[router_configmap.CONFIG_KEY]).upstream("x").canary


def test_the_stable_service_deployment_and_pdb_never_select_canary_pods() -> None:
    dep, _ = stable_world()
    out = step(_, dep, T0)
    cdep, csvc = out.create
    canary_pod = cdep["spec"]["template"]["metadata"]["labels"]
    stable_pod = dep["spec"]["template"]["metadata"]["labels"]
    svc, pdb = render.service("x", "ns", "uid"), render.pod_disruption_budget("x", "ns", "uid")
    for stable_selector in (svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"],
                            pdb["spec"]["selector"]["matchLabels"]):
        assert selects(stable_selector, stable_pod) and not selects(stable_selector, canary_pod)
    assert csvc["kind"] == "Service" and csvc["metadata"]["name"] == "x-vllm-canary"
    assert selects(csvc["spec"]["selector"], canary_pod) and not selects(csvc["spec"]["selector"], stable_pod)
    assert selects(cdep["spec"]["selector"]["matchLabels"], canary_pod)
    assert not selects(cdep["spec"]["selector"]["matchLabels"], stable_pod)
    assert csvc["metadata"]["ownerReferences"] == svc["metadata"]["ownerReferences"]  # collected with the upstream
    # the stable pod template is exactly as before: no new label restarts the engines on an operator upgrade
    assert stable_pod == render.labels("x")
    # the canary runs the desired template: its engine hash is the change's, not recomputed from its labels
    assert cdep["spec"]["template"]["metadata"]["annotations"][render.ENGINE_HASH] == out.status["canary"]["engineHash"]


def test_the_router_gets_the_canary_share_only_while_the_canary_is_analysed_with_replicas_up() -> None:
    dep, status = stable_world()
    assert rendered_canary(status) is None  # no canary at all
    created = step(status, dep, T0)
    assert rendered_canary(created.status) is None  # the canary replicas are still starting
    cdep = complete(created.create[0])
    started = step(created.status, dep, T1, cdep)
    canary = rendered_canary(started.status)
    assert canary is not None and canary.percent == 40
    assert canary.base_url == "http://x-vllm-canary.ns.svc:8000/v1" == render.canary_endpoint("x", "ns")
    back = step(started.status, dep, T2, cdep, (SLOW, GOOD))
    assert back.status["canary"]["phase"] == "RolledBack" and back.delete_canary
    assert rendered_canary(back.status) is None  # the share leaves the router config with the canary


def test_a_promoted_canary_leaves_the_router_config_and_takes_its_service_along() -> None:
    dep, status = stable_world()
    cdep = complete(step(status, dep, T0).create[0])
    started = step(step(status, dep, T0).status, dep, T1, cdep)
    done = step(started.status, dep, "2026-01-01T00:00:30Z", cdep, (GOOD, GOOD))
    assert done.status["canary"]["phase"] == "Promoted" and done.delete_canary
    assert rendered_canary(done.status) is None


def test_a_canary_left_from_an_earlier_spec_takes_no_traffic() -> None:
    dep, status = stable_world()
    cdep = complete(step(status, dep, T0).create[0])
    started = step(step(status, dep, T0).status, dep, T1, cdep)
    # the spec moved on (generation 3, strategy Auto) and the operator has not reconciled yet,
    # or kept status.canary as the last decision: either way the canary is not this generation's
    later = {**started.status, "observedGeneration": 3}
    assert rendered_canary(later) is None
    rolling = {**SPLIT, "rollout": {"strategy": "Auto"}}
    assert rendered_canary(started.status, rolling) is None
    out = reconcile(Observed("x", "ns", "uid", 3, rolling, started.status, dep, canary_deployment=cdep,
                             has_canary_service=True), lambda p: 8, T2)
    assert out.delete_canary and rendered_canary(out.status, rolling) is None


def test_a_missing_canary_service_is_recreated_and_a_lingering_one_deleted() -> None:
    dep, status = stable_world()
    created = step(status, dep, T0)
    cdep = complete(created.create[0])
    again = step(created.status, dep, T1, cdep, has_service=False)  # deleted by hand, say
    assert [(b["kind"], b["metadata"]["name"]) for b in again.create] == [("Service", "x-vllm-canary")]
    assert step(created.status, dep, T1, cdep).create == []  # there: nothing to write
    # the canary Deployment went but its Service did not (a failed delete): no canary wanted, it goes too
    rolling = {**SPLIT, "rollout": {"strategy": "Auto"}}
    out = reconcile(Observed("x", "ns", "uid", 3, rolling, again.status, dep, has_canary_service=True),
                    lambda p: 8, T2)
    assert out.delete_canary


def test_a_canary_labelled_by_an_older_operator_is_replaced_not_kept_behind_the_stable_service() -> None:
    dep, status = stable_world()
    created = step(status, dep, T0)
    old = complete(copy.deepcopy(created.create[0]))
    # before: the canary's pods kept name=vllm, which the stable Service selects
    old["spec"]["selector"]["matchLabels"] = {render.UPSTREAM_LABEL: "x", "app.kubernetes.io/name": "vllm",
                                              render.TRACK_LABEL: "canary"}
    out = step(created.status, dep, T1, old)
    assert out.delete_canary and out.deployment_patch is None  # the stable Deployment is untouched
    assert "older operator" in " ".join(out.log)
