"""Rollout plans and the reconcile decision, from tiny observed states."""

from __future__ import annotations

from typing import Any

from oculis.rollout import Rollout
from oculis_operator import rollout
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

H100 = "NVIDIA-H100-80GB-HBM3"


def node(name: str, gpus: int = 8, product: str = H100) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}}, "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def pod(node_name: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    return {"spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": phase}}


def test_spare_gpus_counts_the_best_node() -> None:
    assert rollout.spare_gpus([node("a"), node("b")], [pod("a", 8), pod("b", 6)], H100) == 2
    assert rollout.spare_gpus([node("a")], [pod("a", 8, "Succeeded")], H100) == 8
    assert rollout.spare_gpus([node("a", product="other")], [], H100) == 0


def test_auto_strategy_surges_only_with_a_spare_gpu() -> None:
    assert rollout.choose_strategy(None, 8, 8, "H100-80GB").rolling_update == {"maxSurge": 1, "maxUnavailable": 0}
    s = rollout.choose_strategy(None, 4, 8, "H100-80GB")
    assert s.rolling_update == {"maxSurge": 0, "maxUnavailable": 1} and "one at a time" in s.reason
    manual = rollout.choose_strategy(Rollout(max_surge=2, max_unavailable=0), 0, 8, "H100-80GB")
    assert manual.rolling_update == {"maxSurge": 2, "maxUnavailable": 0}


def deployment(replicas: int, updated: int, ready: int, total: int | None = None, gen: int = 1) -> dict[str, Any]:
    return {"metadata": {"generation": gen, "annotations": {}},
            "spec": {"replicas": replicas, "template": {"metadata": {"annotations": {}}}},
            "status": {"observedGeneration": gen, "replicas": total if total is not None else replicas,
                       "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready}}


def test_progress_is_complete_only_when_every_replica_is_new_and_ready() -> None:
    assert rollout.progress(deployment(2, 2, 2)).complete
    assert not rollout.progress(deployment(2, 1, 2)).complete
    assert not rollout.progress(deployment(2, 2, 2, total=3)).complete
    assert not rollout.progress({**deployment(2, 2, 2), "metadata": {"generation": 2}}).complete


SPEC = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
        "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxModelLen": 8192}}


def observe(spec: dict[str, Any], dep: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> Observed:
    return Observed("x", "ns", "uid", 3, spec, status or {}, dep)


def test_first_reconcile_creates_everything() -> None:
    out = reconcile(Observed("x", "ns", "uid", 1, SPEC, {}, None, False, False), lambda p: 8, "t")
    assert [b["kind"] for b in out.create] == ["Deployment", "Service", "PodDisruptionBudget"]


def test_steady_state_writes_nothing() -> None:
    first = reconcile(observe(SPEC), lambda p: 8, "t").create[0]
    first["status"] = deployment(2, 2, 2)["status"]
    first["metadata"]["generation"] = 1
    out = reconcile(observe(SPEC, first), lambda p: 8, "t")
    assert out.create == [] and out.deployment_patch is None
    ready = next(c for c in out.status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    assert out.status["engineHash"] == first["spec"]["template"]["metadata"]["annotations"]["oculis.dev/engine-hash"]


def test_scaled_to_zero_is_not_ready() -> None:
    zero = {**SPEC, "replicas": 0}
    dep = reconcile(observe(zero), lambda p: 8, "t").create[0]
    dep["status"] = deployment(0, 0, 0)["status"]
    dep["metadata"]["generation"] = 1
    conds = {c["type"]: c for c in reconcile(observe(zero, dep), lambda p: 8, "t").status["conditions"]}
    assert conds["Ready"]["status"] == "False" and conds["Ready"]["reason"] == "ScaledToZero"
    assert conds["Progressing"]["status"] == "False" and conds["Degraded"]["status"] == "False"


def test_replica_change_patches_only_replicas() -> None:
    dep = reconcile(observe(SPEC), lambda p: 8, "t").create[0]
    out = reconcile(observe({**SPEC, "replicas": 5}, dep), lambda p: (_ for _ in ()).throw(AssertionError), "t")
    assert out.deployment_patch == {"spec": {"replicas": 5}}


def test_refused_change_writes_nothing_and_keeps_the_running_hash() -> None:
    dep = reconcile(observe(SPEC), lambda p: 8, "t").create[0]
    storm = {**SPEC, "engine": {"maxModelLen": 8192, "maxNumSeqs": 10000, "maxNumBatchedTokens": 10000}}
    out = reconcile(observe(storm, dep, {"engineHash": "abc"}), lambda p: 8, "t")
    assert out.create == [] and out.deployment_patch is None
    conds = {c["type"]: c for c in out.status["conditions"]}
    assert conds["CapacityOK"]["status"] == "False" and conds["CapacityOK"]["reason"] == "KVCacheExhausted"
    assert "engine hash abc" in conds["Ready"]["message"] and out.status["engineHash"] == "abc"


def test_invalid_spec_is_reported_not_applied() -> None:
    out = reconcile(observe({**SPEC, "gpu": None}), lambda p: 8, "t")
    assert out.create == [] and out.deployment_patch is None
    degraded = next(c for c in out.status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec" and "gpu" in degraded["message"]


def test_condition_time_moves_only_on_status_change() -> None:
    a = reconcile(observe(SPEC), lambda p: 8, "t1").status
    b = reconcile(observe(SPEC, status=a), lambda p: 8, "t2").status
    assert [c["lastTransitionTime"] for c in b["conditions"]] == ["t1"] * 4
