"""GPUUpstream on the real control plane: the operator's contract with platform engineers."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import eventually
from kubernetes import client
from skips import removable, skip_or_fail

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
G, V, P = "oculis.dev", "v1alpha1", "gpuupstreams"


def upstream(name: str, **spec: Any) -> dict[str, Any]:
    base = {"provider": "vllm", "model": LLAMA_8B, "replicas": 2, "gpu": {"product": "H100-80GB", "count": 1},
            "engine": {"maxModelLen": 16384, "maxNumSeqs": 64, "maxNumBatchedTokens": 8192}}
    return {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": name}, "spec": {**base, **spec}}


class World:
    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.ns = ns
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)

    def create(self, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(G, V, self.ns, P, body)

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(G, V, self.ns, P, name, {"spec": spec})

    def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(G, V, self.ns, P, name)
        return obj

    def cond(self, name: str, type_: str) -> dict[str, Any]:
        conds = self.get(name).get("status", {}).get("conditions", [])
        return next((c for c in conds if c["type"] == type_), {})

    def deployment(self, name: str) -> client.V1Deployment:
        return self.apps.read_namespaced_deployment(f"{name}-vllm", self.ns)

    def pods(self, name: str) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(self.ns, label_selector=f"oculis.dev/upstream={name}").items

    def ready(self, name: str) -> bool:
        st = self.get(name).get("status", {})
        return (self.cond(name, "Ready").get("status") == "True" and st.get("engineHash") is not None
                and st.get("engineHash") == st.get("desiredEngineHash"))


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def test_create_renders_vllm_on_the_right_gpus_and_becomes_ready(world: World, bin_dir: Path,
                                                                  kubeconfig: Path) -> None:
    world.create(upstream("llama"))
    eventually(lambda: world.ready("llama"), what="GPUUpstream Ready")
    dep = world.deployment("llama")
    c = dep.spec.template.spec.containers[0]
    assert c.image == "vllm/vllm-openai:v0.20.0"
    assert c.args[0] == LLAMA_8B
    for flag in ("--max-model-len=16384", "--max-num-seqs=64", "--max-num-batched-tokens=8192",
                 "--tensor-parallel-size=1", "--gpu-memory-utilization=0.92", "--scheduling-policy=fcfs"):
        assert flag in c.args
    assert not any(a.startswith(("--preemption-mode", "--swap-space")) for a in c.args)
    assert c.resources.limits["nvidia.com/gpu"] == "1"
    assert c.readiness_probe.http_get.path == "/health" and c.startup_probe.failure_threshold >= 30
    nodes = {n.metadata.name: n for n in world.core.list_node().items}
    for pod in world.pods("llama"):
        assert nodes[pod.spec.node_name].metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    svc = world.core.read_namespaced_service("llama-vllm", world.ns)
    pdb = client.PolicyV1Api(world.apps.api_client).read_namespaced_pod_disruption_budget("llama-vllm", world.ns)
    for obj in (dep, svc, pdb):
        assert obj.metadata.owner_references[0].kind == "GPUUpstream"
    st = world.get("llama")["status"]
    assert st["capacity"]["kvBytesPerToken"] == 131072 and st["capacity"]["kvCacheTokens"] > 100_000
    assert st["readyReplicas"] == 2 and st["gpu"] == "H100-80GB x1"
    assert world.get("llama")["metadata"].get("annotations", {}) == {}  # no progress kept in annotations
    table = subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "gu", "-n", world.ns],
                           capture_output=True, text=True, check=True).stdout
    assert table.split("\n")[0].split() == ["NAME", "PROVIDER", "MODEL", "GPU", "REPLICAS", "DESIRED",
                                            "READY-REPLICAS", "READY", "REASON", "KV-TOKENS", "OBSERVED-KV",
                                            "MAX-CONC", "CANARY", "ADAPTERS", "AGE"]
    assert "H100-80GB x1" in table and "AllReplicasReady" in table


def test_engine_change_rolls_and_status_shows_the_new_hash(world: World) -> None:
    world.create(upstream("roll"))
    eventually(lambda: world.ready("roll"), what="Ready")
    old_hash = world.get("roll")["status"]["engineHash"]
    old_pods = {p.metadata.name for p in world.pods("roll")}
    world.patch("roll", {"engine": {"maxNumSeqs": 96}})
    eventually(lambda: world.ready("roll") and world.get("roll")["status"]["engineHash"] != old_hash,
               what="rolled to the new hash")
    dep = world.deployment("roll")
    assert "--max-num-seqs=96" in dep.spec.template.spec.containers[0].args
    assert dep.spec.template.metadata.annotations["oculis.dev/engine-hash"] == world.get("roll")["status"]["engineHash"]
    eventually(lambda: not old_pods & {p.metadata.name for p in world.pods("roll")}, what="old pods gone")


def test_replica_only_change_does_not_restart_pods(world: World) -> None:
    world.create(upstream("scale"))
    eventually(lambda: world.ready("scale"), what="Ready")
    before = {p.metadata.name for p in world.pods("scale")}
    world.patch("scale", {"replicas": 3})
    eventually(lambda: world.ready("scale") and world.get("scale")["status"]["readyReplicas"] == 3, what="3 ready")
    assert before <= {p.metadata.name for p in world.pods("scale")}


def test_steady_state_makes_no_writes(world: World) -> None:
    world.create(upstream("quiet"))
    eventually(lambda: world.ready("quiet"), what="Ready")
    import time

    time.sleep(1)
    def versions() -> tuple[str, str]:
        return world.get("quiet")["metadata"]["resourceVersion"], world.deployment("quiet").metadata.resource_version

    rv = versions()
    time.sleep(4)
    assert versions() == rv


def test_preemption_storm_is_refused_and_the_deployment_left_alone(world: World) -> None:
    world.create(upstream("storm"))
    eventually(lambda: world.ready("storm"), what="Ready")
    before = world.deployment("storm")
    pods_before = {p.metadata.name for p in world.pods("storm")}
    world.patch("storm", {"engine": {"maxNumSeqs": 5000, "maxNumBatchedTokens": 8192},
                          "traffic": {"avgPromptTokens": 4000, "avgOutputTokens": 1000}})

    def refused() -> dict[str, Any]:
        c = world.cond("storm", "CapacityOK")
        return c if c.get("status") == "False" else {}

    c = eventually(refused, what="CapacityOK=False")
    assert c["reason"] == "KVCacheExhausted"
    assert "ERR_OCULIS_KV_CACHE_EXHAUSTED" in c["message"] and "largest safe maxNumSeqs is" in c["message"]
    assert world.cond("storm", "Ready")["reason"] == "ChangeRefused"
    after = world.deployment("storm")
    assert after.metadata.generation == before.metadata.generation
    assert after.spec.template == before.spec.template
    assert {p.metadata.name for p in world.pods("storm")} == pods_before


def test_operator_metrics_count_reconciles_and_a_refusal_once(world: World, operator: Any) -> None:
    port = operator.env["OCULIS_METRICS_PORT"]

    def metric(name: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(name))

    refusals = 'oculis_operator_refusals_total{reason="KVCacheExhausted"}'
    before = metric(refusals)
    world.create(upstream("metered"))
    eventually(lambda: world.ready("metered"), what="Ready")
    assert metric('oculis_operator_reconciles_total{result="ok"}') >= 1
    assert metric("oculis_operator_api_requests_total") >= 1 and metric("process_resident_memory_bytes") > 0
    assert metric('oculis_operator_upstreams{ready="true"}') >= 1
    world.patch("metered", {"engine": {"maxNumSeqs": 5000, "maxNumBatchedTokens": 8192},
                            "traffic": {"avgPromptTokens": 4000, "avgOutputTokens": 1000}})
    eventually(lambda: world.cond("metered", "CapacityOK").get("status") == "False", what="refused")
    world.patch("metered", {"pricing": {"inputPerMtok": 0.1}})  # another reconcile of the same refused change
    eventually(lambda: world.get("metered")["status"].get("observedGeneration") == world.get("metered")[
        "metadata"]["generation"], what="observed")
    assert metric(refusals) - before == 2  # one per refused generation, not one per reconcile


def test_webhook_refuses_a_sequence_that_cannot_fit(world: World) -> None:
    with pytest.raises(client.ApiException) as err:
        world.create(upstream("huge", engine={"maxModelLen": 2_000_000}))
    assert err.value.status in (400, 422)
    assert "ERR_OCULIS_KV_CACHE_EXHAUSTED" in err.value.body and "largest safe maxModelLen" in err.value.body
    with pytest.raises(client.ApiException) as err:
        world.create(upstream("tp", model="meta-llama/Llama-3.1-70B-Instruct",
                              gpu={"product": "H100-80GB", "count": 1}))
    assert "ERR_OCULIS_KV_CACHE_EXHAUSTED" in err.value.body and "weights" in err.value.body
    with pytest.raises(client.ApiException) as err:
        world.create(upstream("unknown", model="acme/llama-finetune"))
    assert "ERR_OCULIS_UNKNOWN_MODEL" in err.value.body and "spec.modelConfig" in err.value.body
    # With its architecture given inline, the same model is admitted and planned.
    world.create(upstream("known", model="acme/llama-finetune", modelConfig={
        "paramsBillions": 8.03, "numLayers": 32, "hiddenSize": 4096, "numAttentionHeads": 32, "numKvHeads": 8,
        "headDim": 128, "vocabSize": 128256, "maxPositionEmbeddings": 131072}))
    eventually(lambda: world.get("known").get("status", {}).get("capacity", {}).get("kvBytesPerToken") == 131072,
               what="planned from modelConfig")


def test_tokenizer_mismatch_is_refused(world: World) -> None:
    body = upstream("spec", model="Qwen/Qwen2.5-7B-Instruct", engine={
        "maxModelLen": 8192, "speculative": {"draftModel": "meta-llama/Llama-3.2-1B-Instruct"}})
    with pytest.raises(client.ApiException) as err:
        world.create(body)
    assert "ERR_OCULIS_TOKENIZER_MISMATCH" in err.value.body
    same_family = upstream("spec", engine={"maxModelLen": 8192,
                                           "speculative": {"draftModel": "meta-llama/Llama-3.2-1B-Instruct"}})
    world.create(same_family)
    eventually(lambda: world.ready("spec"), what="draft-model upstream Ready")
    args = world.deployment("spec").spec.template.spec.containers[0].args
    assert '--speculative-config={"model":"meta-llama/Llama-3.2-1B-Instruct","num_speculative_tokens":4}' in args


def test_rollout_without_a_spare_gpu_goes_one_at_a_time(world: World) -> None:
    # Two replicas of 8 GPUs fill both A100 nodes: no room for a surge pod. So the pool must be empty first.
    def a100_holders() -> set[str]:
        pods = world.core.list_pod_for_all_namespaces().items
        return {p.metadata.namespace for p in pods if p.spec.node_name and p.spec.node_name.startswith("a100")}

    # Other tests' namespaces (conftest's `t-...`) go on their own, as their deletion completes; a namespace
    # no test made does not (`make demo` leaves `demo` holding four A100s), so it is named rather than awaited.
    eventually(lambda: not {ns for ns in a100_holders() if ns.startswith("t-")}, timeout=120,
               what="other tests' pods to leave the A100 pool")
    if others := a100_holders():
        skip_or_fail(removable(f"the A100 pool is held by namespace(s) {', '.join(sorted(others))}, which no test "
                               "created (make demo leaves `demo` running)",
                               "e2e/cluster down before make test, or delete those namespaces"))
    world.create(upstream("full", gpu={"product": "A100-80GB", "count": 8}))
    eventually(lambda: world.ready("full"), what="Ready")
    world.patch("full", {"engine": {"maxNumSeqs": 32}})
    eventually(lambda: "one at a time" in world.get("full")["status"].get("rollout", ""), what="one-at-a-time plan")
    dep = world.deployment("full")
    assert dep.spec.strategy.rolling_update.max_surge == 0 and dep.spec.strategy.rolling_update.max_unavailable == 1
    eventually(lambda: world.ready("full") and "--max-num-seqs=32" in world.pods("full")[0].spec.containers[0].args,
               timeout=90, what="rollout complete")


def test_external_upstream_with_missing_secret_is_not_ready(world: World) -> None:
    world.create({"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "gpt4o"},
                  "spec": {"provider": "openai", "model": "gpt-4o",
                           "apiKeySecretRef": {"name": "openai", "key": "key"}}})
    c = eventually(lambda: world.cond("gpt4o", "Ready") or None, what="Ready condition")
    assert c["status"] == "False" and c["reason"] == "SecretNotFound"
    assert "kubectl create secret generic openai" in c["message"]
    # The upstream itself is never touched again: the operator rechecks waiting upstreams by name.
    world.core.create_namespaced_secret(world.ns, client.V1Secret(metadata=client.V1ObjectMeta(name="openai"),
                                                                  string_data={"other": "x"}))
    eventually(lambda: world.cond("gpt4o", "Ready").get("reason") == "SecretKeyMissing", what="key missing")
    assert "no key 'key'" in world.cond("gpt4o", "Ready")["message"]
    world.core.patch_namespaced_secret("openai", world.ns, {"stringData": {"key": "sk-test"}})
    eventually(lambda: world.cond("gpt4o", "Ready").get("status") == "True", what="Ready once the key exists")
    # And the other way: a Secret deleted after the fact is noticed (every 6th recheck round: ~6 s here).
    world.core.delete_namespaced_secret("openai", world.ns)
    eventually(lambda: world.cond("gpt4o", "Ready").get("reason") == "SecretNotFound", timeout=30,
               what="not Ready once the Secret is gone")
    with pytest.raises(client.ApiException):
        world.deployment("gpt4o")


def test_deletion_cleans_up(world: World) -> None:
    world.create(upstream("gone", replicas=1))
    eventually(lambda: world.ready("gone"), what="Ready")
    world.custom.delete_namespaced_custom_object(G, V, world.ns, P, "gone")

    def collected() -> bool:
        try:
            world.deployment("gone")
            return False
        except client.ApiException as exc:
            return exc.status == 404

    eventually(collected, what="Deployment garbage-collected")
    eventually(lambda: not world.pods("gone"), what="pods gone")


def test_workload_deleted_by_hand_is_recreated(world: World) -> None:
    world.create(upstream("kept", replicas=1))
    eventually(lambda: world.ready("kept"), what="Ready")
    policy = client.PolicyV1Api(world.core.api_client)
    old = {"deploy": world.deployment("kept").metadata.uid,
           "svc": world.core.read_namespaced_service("kept-vllm", world.ns).metadata.uid,
           "pdb": policy.read_namespaced_pod_disruption_budget("kept-vllm", world.ns).metadata.uid}
    # Service and PDB first, alone: nothing else changes, so only their own deletion can bring them back.
    world.core.delete_namespaced_service("kept-vllm", world.ns)
    policy.delete_namespaced_pod_disruption_budget("kept-vllm", world.ns)

    def uid(read: Any) -> str | None:
        try:
            return str(read("kept-vllm", world.ns).metadata.uid)
        except client.ApiException:
            return None

    for key, read in (("svc", world.core.read_namespaced_service),
                      ("pdb", policy.read_namespaced_pod_disruption_budget)):
        eventually(lambda read=read, key=key: uid(read) not in (None, old[key]), what=f"{key} recreated")
    world.apps.delete_namespaced_deployment("kept-vllm", world.ns)
    eventually(lambda: uid(world.apps.read_namespaced_deployment) not in (None, old["deploy"]),
               what="Deployment recreated")
    eventually(lambda: world.ready("kept"), what="Ready again")


def test_operator_restart_mid_rollout_resumes(world: World, operator: Any) -> None:
    slow = {"oculis.dev/e2e-ready-delay": "3s"}
    world.create(upstream("resume", replicas=3, podAnnotations=slow))
    eventually(lambda: world.ready("resume"), timeout=90, what="Ready")
    world.patch("resume", {"engine": {"maxNumSeqs": 48}})
    eventually(lambda: world.get("resume")["status"].get("desiredEngineHash") != world.get("resume")["status"].get(
        "engineHash"), what="rollout started")
    operator.stop(hard=True)
    try:
        assert world.cond("resume", "Ready").get("status") == "False"
    finally:
        operator.start()
        operator.wait_ready(operator.webhook_registered)
    eventually(lambda: world.ready("resume"), timeout=120, what="rollout finished after restart")
    assert all("--max-num-seqs=48" in p.spec.containers[0].args for p in world.pods("resume"))


def test_a_refused_write_is_reported_once_and_retried_without_a_touch(world: World, operator: Any) -> None:
    # A ResourceQuota forbids Deployments: the API refuses the operator's create. The operator says so
    # in one line (log and Event, no traceback) and creates the Deployment once the quota is gone,
    # with no further change to the GPUUpstream.
    log_start = len(operator.log())
    world.core.create_namespaced_resource_quota(world.ns, client.V1ResourceQuota(
        metadata=client.V1ObjectMeta(name="no-deployments"),
        spec=client.V1ResourceQuotaSpec(hard={"count/deployments.apps": "0"})))
    world.create(upstream("quota", replicas=1))

    def warned() -> list[Any]:
        return [e for e in world.core.list_namespaced_event(world.ns).items
                if e.reason == "ReconcileFailed" and e.involved_object.name == "quota"]

    events = eventually(lambda: warned() or None, what="a ReconcileFailed event")
    assert "403 Forbidden" in events[0].message and "no-deployments" in events[0].message
    time.sleep(3)  # several rechecks later: still one event, not one per retry
    assert len(warned()) == 1 and (warned()[0].count or 1) == 1
    new_log = operator.log()[log_start:]
    assert "Traceback" not in new_log and "quota] reconcile failed" in new_log
    world.core.delete_namespaced_resource_quota("no-deployments", world.ns)
    eventually(lambda: world.ready("quota"), timeout=60, what="Ready once the quota is gone")
