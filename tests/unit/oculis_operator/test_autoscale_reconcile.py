"""The reconcile applies an autoscaling decision to the Deployment's replicas only, never to spec."""

from __future__ import annotations

import copy
from typing import Any

from oculis_operator.autoscale import Decision, State, gpu_wait_text
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

SPEC = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 1,
        "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxModelLen": 8192},
        "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}


def running(replicas: int) -> dict[str, Any]:
    dep = reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, None), lambda p: 8, "t").create[0]
    dep["spec"]["replicas"] = replicas
    dep["metadata"]["generation"] = 1
    dep["status"] = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                     "readyReplicas": replicas, "availableReplicas": replicas}
    return dep


def conds(out: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in out.status["conditions"]}


def test_autoscaling_decision_patches_only_replicas_and_leaves_spec_alone() -> None:
    spec = copy.deepcopy(SPEC)
    d = Decision(3, "ScaleUp", "waiting 20 ask for 3", State(), True)
    out = reconcile(Observed("x", "ns", "uid", 1, spec, {}, running(1), autoscale=d), lambda p: 8, "t")
    assert out.deployment_patch == {"spec": {"replicas": 3}}
    assert spec == SPEC  # the user's spec is never written
    assert out.status["autoscaling"]["desiredReplicas"] == 3 and out.status["autoscaling"]["reason"] == "ScaleUp"
    assert conds(out)["ScalingActive"]["status"] == "True"


def test_missing_metrics_hold_and_say_so() -> None:
    d = Decision(2, "MetricsMissing", "no engine metrics from Prometheus; holding 2 replicas", State(), False)
    out = reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, running(2), autoscale=d), lambda p: 8, "t")
    assert out.deployment_patch is None
    c = conds(out)["ScalingActive"]
    assert (c["status"], c["reason"]) == ("False", "MetricsMissing")


def test_a_scale_up_the_pool_cannot_place_names_the_pool_once() -> None:
    wait = gpu_wait_text("H100-80GB", 4, 2)
    d = Decision(2, "WaitingForGPUs", f"ask for 4; {wait}", State(), True, shortfall=2, wait=wait)
    out = reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, running(1), autoscale=d), lambda p: 8, "t")
    assert out.deployment_patch == {"spec": {"replicas": 2}}
    p = conds(out)["Progressing"]
    assert (p["status"], p["reason"]) == ("True", "WaitingForGPUs") and "H100-80GB" in p["message"]
    assert "2 short" in p["message"]
    assert ("WaitingForGPUs", wait) in out.warnings


def test_decision_is_ignored_without_spec_autoscaling() -> None:
    plain = {k: v for k, v in SPEC.items() if k != "autoscaling"}
    d = Decision(3, "ScaleUp", "m", State(), True)
    out = reconcile(Observed("x", "ns", "uid", 1, plain, {}, running(1), autoscale=d), lambda p: 8, "t")
    assert out.deployment_patch is None and "autoscaling" not in out.status


def test_router_config_marks_an_upstream_with_no_ready_replica_as_scaled_to_zero() -> None:
    from oculis_operator.upstream_entry import upstream_entry

    def obj(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "x", "namespace": "ns", "generation": 1}, "spec": spec, "status": status}

    zero = {"readyReplicas": 0, "conditions": [{"type": "Ready", "status": "False", "reason": "ScaledToZero"}]}
    waking = {"readyReplicas": 0, "conditions": [{"type": "Ready", "status": "False", "reason": "RollingUpdate"},
                                                 {"type": "Progressing", "status": "True", "reason": "RollingUpdate"}]}
    serving = {"readyReplicas": 1, "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}]}
    plain = {k: v for k, v in SPEC.items() if k != "autoscaling"}
    assert upstream_entry(obj(SPEC, zero))[0]["scaled_to_zero"] is True
    assert upstream_entry(obj(plain, zero))[0]["scaled_to_zero"] is True  # spec.replicas 0 too
    assert upstream_entry(obj(SPEC, waking))[0]["scaled_to_zero"] is True  # woken, no replica serves yet
    assert "scaled_to_zero" not in upstream_entry(obj(SPEC, serving))[0]
    assert "scaled_to_zero" not in upstream_entry(obj(plain, waking))[0]  # a rollout: routes fail over as before
