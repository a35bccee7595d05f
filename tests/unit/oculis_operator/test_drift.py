"""The operator owns what it made: hand edits of the Deployment, Service or PDB are found field by field
(API-server defaults are not edits) and reverted by one merge patch; the status never says Ready meanwhile."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from oculis_operator import drift, rollout
from oculis_operator.reconcile import reconcile
from oculis_operator.reconcile_io import Observed

SPEC = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
        "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxModelLen": 8192},
        "resources": {"requests": {"cpu": "0.5", "memory": "1024Mi"}}}


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def served(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores: our object plus its defaults and canonical quantities."""
    live = copy.deepcopy(obj)
    live["metadata"].update(uid="u", resourceVersion="7", generation=1)
    if live["kind"] == "Deployment":
        live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "1"
        live["spec"]["template"]["metadata"].setdefault("creationTimestamp", None)
        pod = live["spec"]["template"]["spec"]
        pod.update(dnsPolicy="ClusterFirst", restartPolicy="Always", schedulerName="default-scheduler",
                   securityContext={})
        for c in pod["containers"]:
            c.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log",
                     terminationMessagePolicy="File")
            c["ports"][0]["protocol"] = "TCP"
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                c[probe]["successThreshold"] = 1
                if "httpGet" in c[probe]:  # the one-token startup probe is an exec: no scheme to default
                    c[probe]["httpGet"]["scheme"] = "HTTP"
            requests = c["resources"]["requests"]
            requests.update({k: {"0.5": "500m", "1024Mi": "1Gi"}.get(v, v) for k, v in requests.items()})
        live["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
        live["status"] = {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                          "availableReplicas": 2}
    if live["kind"] == "Service":
        live["spec"].update(type="ClusterIP", clusterIP="10.96.0.12", sessionAffinity="None")
        live["spec"]["ports"][0]["protocol"] = "TCP"
    return live


def first(spec: dict[str, Any] = SPEC) -> list[dict[str, Any]]:
    return reconcile(Observed("llama", "ns", "uid", 1, spec, {}, None, False, False), lambda p: 8, "t").create


def steady(spec: dict[str, Any] = SPEC) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The live Deployment, Service and PDB as created, and the status of the reconcile that sees them."""
    dep, svc, pdb = (served(o) for o in first(spec))
    out = reconcile(Observed("llama", "ns", "uid", 1, spec, {}, dep, service=svc, pdb=pdb), lambda p: 8, "t")
    return dep, svc, pdb, out.status


def observe(dep: dict[str, Any], svc: dict[str, Any], pdb: dict[str, Any], status: dict[str, Any],
            spec: dict[str, Any] = SPEC) -> Observed:
    return Observed("llama", "ns", "uid", 1, spec, status, dep, service=svc, pdb=pdb)


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_api_server_defaults_and_canonical_quantities_are_not_drift() -> None:
    dep, svc, pdb, status = steady()
    assert conds(status)["Ready"]["status"] == "True"
    out = reconcile(observe(dep, svc, pdb, status), lambda p: 8, "t")
    assert (out.deployment_patch, out.service_patch, out.pdb_patch, out.warnings) == (None, None, None, [])
    # `kubectl rollout restart` is a restart, not an edit of what we own.
    dep["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = "now"
    assert drift.differences(first()[0], dep, drift.DEPLOYMENT) == []


def edit(dep: dict[str, Any], how: str) -> None:
    c = dep["spec"]["template"]["spec"]["containers"][0]
    pod = dep["spec"]["template"]["spec"]
    match how:
        case "image":
            c["image"] = "evil/image:latest"
        case "args":
            c["args"] = [*c["args"], "--enforce-eager"]
        case "env":
            c["env"] = [{"name": "HF_TOKEN", "value": "x"}]
        case "resources":
            c["resources"]["limits"]["memory"] = "1Gi"
        case "gpus":
            c["resources"]["limits"]["nvidia.com/gpu"] = "2"
        case "sidecar":
            pod["containers"].append({"name": "sidecar", "image": "busybox"})
        case "label":
            del dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        case "annotation":
            dep["spec"]["template"]["metadata"]["annotations"]["oculis.dev/e2e-ready-delay"] = "1h"
        case "nodeSelector":
            pod["nodeSelector"] = {"zone": "elsewhere"}
        case "tolerations":
            pod["tolerations"] = []
        case "privileged":
            c["securityContext"]["privileged"] = True
        case "runAsRoot":
            pod["securityContext"] = {"runAsUser": 0}
        case "probe":
            c["readinessProbe"]["httpGet"]["path"] = "/"
        case "paused":
            dep["spec"]["paused"] = True


@pytest.mark.parametrize("how", ["image", "args", "env", "resources", "gpus", "sidecar", "label", "annotation",
                                 "nodeSelector", "tolerations", "privileged", "runAsRoot", "probe",
                                 "paused"])
def test_hand_edits_of_the_deployment_template_are_reverted_and_not_ready(how: str) -> None:
    dep, svc, pdb, status = steady()
    edit(dep, how)
    out = reconcile(observe(dep, svc, pdb, status), lambda p: 8, "t")
    assert out.deployment_patch is not None
    assert [r for r, _ in out.warnings] == ["DriftReverted"] and "Deployment llama-vllm" in out.warnings[0][1]
    ready = conds(out.status)["Ready"]
    assert ready["status"] == "False" and ready["reason"] == "DriftReverted"
    # The patch puts every owned field back, so the next reconcile finds nothing and is Ready again.
    fixed = merge(dep, out.deployment_patch)
    assert drift.differences(first()[0], fixed, drift.DEPLOYMENT) == []
    again = reconcile(observe(fixed, svc, pdb, out.status), lambda p: 8, "t")
    assert again.deployment_patch is None and conds(again.status)["Ready"]["status"] == "True"


def test_removed_spec_fields_leave_the_live_deployment_on_a_rollout() -> None:
    # nodeSelector and podAnnotations dropped from the spec: a merge patch of the new spec alone
    # would keep the old keys, so the rollout patch removes them.
    with_extras = {**SPEC, "nodeSelector": {"zone": "a"}, "podAnnotations": {"team": "x"}}
    dep, svc, pdb, status = steady(with_extras)
    out = reconcile(observe(dep, svc, pdb, status), lambda p: 8, "t")
    assert out.deployment_patch is not None and out.warnings == []  # a rollout, not drift
    rolled = merge(dep, out.deployment_patch)
    template = rolled["spec"]["template"]
    assert "nodeSelector" not in template["spec"] and "team" not in template["metadata"]["annotations"]


def test_hand_edits_of_the_service_and_pdb_are_reverted() -> None:
    dep, svc, pdb, status = steady()
    svc["spec"]["selector"] = {**svc["spec"]["selector"], "oculis.dev/upstream": "other", "extra": "x"}
    svc["spec"]["ports"][0]["targetPort"] = 9999
    svc["spec"]["type"] = "NodePort"
    pdb["spec"] = {"minAvailable": 2, "selector": pdb["spec"]["selector"]}
    out = reconcile(observe(dep, svc, pdb, status), lambda p: 8, "t")
    message = out.warnings[0][1]
    assert ("Service llama-vllm: spec.type, spec.selector.oculis.dev/upstream, spec.selector.extra, "
            "spec.ports[0].targetPort") in message
    assert "PodDisruptionBudget llama-vllm: spec.maxUnavailable, spec.minAvailable" in message
    assert conds(out.status)["Ready"]["status"] == "False"
    assert out.service_patch is not None and out.pdb_patch is not None
    svc2, pdb2 = merge(svc, out.service_patch), merge(pdb, out.pdb_patch)
    assert svc2["spec"]["selector"] == {"oculis.dev/upstream": "llama", "app.kubernetes.io/name": "vllm"}
    assert svc2["spec"]["clusterIP"] == "10.96.0.12"  # what the API server set is left alone
    assert svc2["spec"]["type"] == "ClusterIP"
    assert pdb2["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}
    again = reconcile(observe(dep, svc2, pdb2, out.status), lambda p: 8, "t")
    assert (again.service_patch, again.pdb_patch, again.warnings) == (None, None, [])


def test_quantities_compare_by_value() -> None:
    assert drift.quantity("500m") == drift.quantity("0.5") and drift.quantity("1Gi") == drift.quantity("1024Mi")
    assert drift.quantity("1G") != drift.quantity("1Gi") and drift.quantity("lots") is None


def test_a_model_change_keeps_the_served_alias() -> None:
    # The router asks for the upstream's name, which old and new pods both serve during the rollout.
    dep, svc, pdb, status = steady()
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    i = args.index("--served-model-name")
    assert args[i + 1: i + 3] == ["llama", "meta-llama/Llama-3.1-8B-Instruct"]
    assert status["servedModel"] == "llama"
    qwen = {**SPEC, "model": "Qwen/Qwen3-8B"}
    out = reconcile(observe(dep, svc, pdb, status, qwen), lambda p: 8, "t")
    new_args = out.deployment_patch["spec"]["template"]["spec"]["containers"][0]["args"]  # type: ignore[index]
    j = new_args.index("--served-model-name")
    assert new_args[j + 1: j + 3] == ["llama", "Qwen/Qwen3-8B"] and out.status["servedModel"] == "llama"


def test_served_model_is_set_only_once_every_replica_serves_the_alias() -> None:
    # An engine rendered before the alias existed does not answer it: until the rollout completes the
    # router keeps asking for the model id.
    dep = served(first()[0])
    dep["status"]["updatedReplicas"] = 1
    out = reconcile(Observed("llama", "ns", "uid", 1, SPEC, {}, dep), lambda p: 8, "t")
    assert out.status["servedModel"] is None


def pool(*allocatable: int) -> Any:
    return lambda product: rollout.Pool(tuple(allocatable))


@pytest.mark.parametrize(("spec", "nodes", "reason", "words"), [
    ({**SPEC, "gpu": {"product": "H100-80GB", "count": 16}}, (8, 8), "NoNodeCanHost",
     "no node offers 16 nvidia.com/gpu of H100-80GB"),
    ({**SPEC, "gpu": {"product": "H200-141GB", "count": 1}}, (), "NoNodeCanHost",
     "no node has nvidia.com/gpu.product=NVIDIA-H200"),
    ({**SPEC, "replicas": 1000}, (8, 8), "ExceedsPool", "fit at most 16 replicas"),
])
def test_a_gpu_request_no_node_can_host_is_degraded(spec: dict[str, Any], nodes: tuple[int, ...], reason: str,
                                                    words: str) -> None:
    out = reconcile(Observed("llama", "ns", "uid", 1, spec, {}, None, False, False), lambda p: 0, "t", pool(*nodes))
    c = conds(out.status)
    assert c["Degraded"]["status"] == "True" and c["Degraded"]["reason"] == reason and words in c["Degraded"]["message"]
    assert c["Ready"]["reason"] == reason and out.warnings == [(reason, c["Degraded"]["message"])]
    assert out.create  # still created: a node pool may scale up from zero for its Pending pods


def test_a_hostable_request_is_not_degraded_and_a_running_one_asks_no_nodes() -> None:
    out = reconcile(Observed("llama", "ns", "uid", 1, SPEC, {}, None, False, False), lambda p: 8, "t", pool(8))
    assert conds(out.status)["Degraded"]["status"] == "False" and out.warnings == []
    dep, svc, pdb, status = steady()

    def no_nodes(product: str) -> rollout.Pool:
        raise AssertionError("all replicas run: no need to look at nodes")

    reconcile(observe(dep, svc, pdb, status), lambda p: 8, "t", no_nodes)


def test_refusal_reasons_say_what_was_refused_and_print_no_capacity() -> None:
    dep, svc, pdb, status = steady()
    assert status["capacity"]["kvCacheTokens"] > 0
    tp3 = {**SPEC, "gpu": {"product": "H100-80GB", "count": 3}}
    out = reconcile(observe(dep, svc, pdb, status, tp3), lambda p: 8, "t")
    c = conds(out.status)["CapacityOK"]
    assert c["status"] == "False" and c["reason"] == "TensorParallelHeads" and "TENSOR_PARALLEL_HEADS" in c["message"]
    assert out.status["capacity"] is None  # KV-TOKENS / MAX-CONC stay blank for a refused spec
    assert out.warnings == [("ChangeRefused", c["message"])] and out.deployment_patch is None


@pytest.mark.parametrize("name", ["llama.dot", "8b-digit", "Upper", "a" * 53, "dash-"])
def test_a_name_no_service_can_carry_creates_nothing(name: str) -> None:
    out = reconcile(Observed(name, "ns", "uid", 1, SPEC, {}, None, False, False), lambda p: 8, "t")
    assert out.create == [] and out.deployment_patch is None
    c = conds(out.status)
    assert c["Ready"]["reason"] == c["Degraded"]["reason"] == "InvalidName" and "DNS-1035" in c["Ready"]["message"]
    from oculis_operator.admission import admission_verdict

    assert "DNS-1035" in (admission_verdict(SPEC, name) or "")
    assert admission_verdict(SPEC, "llama-8b") is None


def test_the_webhook_warns_of_a_request_no_node_can_host() -> None:
    from oculis_operator.admission import admission_warning

    sixteen = {**SPEC, "gpu": {"product": "H100-80GB", "count": 16}}
    assert (admission_warning(sixteen, pool(8, 8)) or "").startswith("NoNodeCanHost: no node offers 16")
    assert admission_warning(SPEC, pool(8)) is None
    assert admission_warning({"provider": "openai", "model": "gpt-4o"}, pool()) is None
