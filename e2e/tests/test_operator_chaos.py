"""Operator chaos on the real control plane: during rolling updates of several GPUUpstreams the
operator is SIGKILLed at random points (10 times), kube-apiserver is restarted, etcd is paused
(SIGSTOP/SIGCONT) and specs are edited concurrently. After each fault everything must converge:
every upstream Ready on its last spec, exactly one Deployment per upstream and no pod beyond its
replicas, nothing of the user's deleted, status equal to what runs. Prints the time to converge
after each fault. Uses its own operator process (the session one is never killed)."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_support import E2E, eventually
from kubernetes import client
from operator_fixture import OperatorProcess

sys.path.insert(0, str(E2E))
import localcluster

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
G, V, P = "oculis.dev", "v1alpha1", "gpuupstreams"
NAMES = ("chaos-a", "chaos-b", "chaos-c")
PRODUCTS = {"chaos-a": "H100-80GB", "chaos-b": "A100-80GB", "chaos-c": "H100-80GB"}


def upstream(name: str) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": name}, "spec": {
        "provider": "vllm", "model": LLAMA_8B, "replicas": 2, "gpu": {"product": PRODUCTS[name], "count": 1},
        "engine": {"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 8192},
        # A model load of 3 s per pod: a rolling update lasts long enough for the faults to land in it.
        "podAnnotations": {"oculis.dev/e2e-ready-delay": "3s"}}}


class Cluster:
    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.ns = ns
        self.custom = client.CustomObjectsApi(api)
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)

    def get(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(G, V, self.ns, P, name)
        return obj

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        # Retried: a write can meet the API server restarting or etcd paused, as a user's would.
        eventually(lambda: self.custom.patch_namespaced_custom_object(G, V, self.ns, P, name, {"spec": spec})
                   or True, timeout=60, what=f"patch {name}")

    def problems(self, name: str) -> list[str]:
        """Why `name` has not converged on its last spec (empty when it has)."""
        obj = self.get(name)
        spec, st = obj["spec"], obj.get("status", {})
        conds = {c["type"]: c for c in st.get("conditions", [])}
        out = []
        if conds.get("Ready", {}).get("status") != "True":
            out.append(f"Ready={conds.get('Ready', {}).get('status')} ({conds.get('Ready', {}).get('reason')})")
        seen = conds.get("Ready", {}).get("observedGeneration")
        if seen != obj["metadata"]["generation"]:  # a Ready of an older spec says nothing of this one
            out.append(f"Ready judged generation {seen}, the spec is {obj['metadata']['generation']}")
        if not st.get("engineHash") or st.get("engineHash") != st.get("desiredEngineHash"):
            out.append("engineHash != desiredEngineHash")
        deps = [d for d in self.apps.list_namespaced_deployment(self.ns).items
                if (d.metadata.labels or {}).get("oculis.dev/upstream") == name]
        if len(deps) != 1:
            return [*out, f"{len(deps)} Deployments"]
        dep = deps[0]
        args = dep.spec.template.spec.containers[0].args
        if f"--max-num-seqs={spec['engine']['maxNumSeqs']}" not in args:
            out.append(f"Deployment not on maxNumSeqs {spec['engine']['maxNumSeqs']}")
        if dep.spec.replicas != spec["replicas"]:
            out.append(f"Deployment replicas {dep.spec.replicas} != spec {spec['replicas']}")
        if (dep.spec.template.metadata.annotations or {}).get("oculis.dev/engine-hash") != st.get("engineHash"):
            out.append("status.engineHash is not the running template's")
        pods = [p for p in self.core.list_namespaced_pod(self.ns, label_selector=f"oculis.dev/upstream={name}").items
                if p.metadata.deletion_timestamp is None]
        if len(pods) != spec["replicas"]:
            out.append(f"{len(pods)} pods for {spec['replicas']} replicas")
        if st.get("readyReplicas") != (dep.status.ready_replicas or 0) or st.get("readyReplicas") != spec["replicas"]:
            out.append(f"status.readyReplicas {st.get('readyReplicas')} vs Deployment {dep.status.ready_replicas}")
        owners = dep.metadata.owner_references or []
        if [o.name for o in owners] != [name] or owners[0].uid != obj["metadata"]["uid"]:
            out.append("Deployment not owned by its GPUUpstream")
        return out

    def converged(self) -> bool:
        found = {n: self.problems(n) for n in NAMES}
        self.last = {n: p for n, p in found.items() if p}
        return not self.last


@pytest.fixture
def chaos_operator(kubeconfig: Path, crds: None, tmp_path: Path) -> Any:
    proc = OperatorProcess(kubeconfig, tmp_path)
    yield proc
    proc.stop(hard=True)


def test_operator_converges_after_kills_api_restarts_and_etcd_pauses(api: client.ApiClient, namespace: str,
                                                                     chaos_operator: OperatorProcess,
                                                                     operator: Any) -> None:
    # `operator` (the session's) is stopped for the test's length: two operators would fight over
    # the same objects, which is no fault this test means to inject.
    operator.stop()
    try:
        run_chaos(api, namespace, chaos_operator)
    finally:
        chaos_operator.stop(hard=True)
        operator.start()
        operator.wait_ready(operator.webhook_registered)


def run_chaos(api: client.ApiClient, namespace: str, chaos_operator: OperatorProcess) -> None:
    cl = Cluster(api, namespace)
    rng = random.Random(17)
    # The user's own objects in the namespace: no fault may make the operator delete them.
    cl.core.create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="users-notes", labels={"oculis.dev/upstream": "chaos-a"}),
        data={"k": "v"}))
    chaos_operator.start()
    time.sleep(3)
    for n in NAMES:
        cl.custom.create_namespaced_custom_object(G, V, namespace, P, upstream(n))
    t0 = time.monotonic()
    eventually(cl.converged, timeout=180, what="first convergence")
    print(f"\ninitial convergence: {time.monotonic() - t0:.1f} s")
    seqs = 32
    timings: list[tuple[str, float]] = []
    mid_rollout = 0
    for i in range(10):
        seqs += 8
        # Concurrent edits: an engine change of every upstream and a replica change of one, at once.
        edits = [threading.Thread(target=cl.patch, args=(n, {"engine": {"maxNumSeqs": seqs}})) for n in NAMES]
        edits.append(threading.Thread(target=cl.patch, args=(NAMES[i % 3], {"replicas": 2 + (i % 2)})))
        for t in edits:
            t.start()
        for t in edits:
            t.join()
        time.sleep(rng.uniform(0.2, 3.0))  # a random point of the rolling updates
        midway = {n: p for n in NAMES if (p := cl.problems(n))}
        chaos_operator.stop(hard=True)  # SIGKILL
        fault = "operator SIGKILLed"
        if i == 3:
            took = localcluster.restart_component("kube-apiserver")
            fault += f" + kube-apiserver restarted ({took:.1f} s)"
        if i == 6:
            with localcluster.paused("etcd"):
                time.sleep(4)
            fault += " + etcd paused 4 s"
        time.sleep(rng.uniform(0, 2))
        chaos_operator.start()
        t0 = time.monotonic()
        try:
            eventually(cl.converged, timeout=180, what=f"convergence after fault {i + 1}")
        except AssertionError:
            raise AssertionError(f"after fault {i + 1} ({fault}) not converged: {cl.last}\n"
                                 f"{chaos_operator.log()[-3000:]}") from None
        took = time.monotonic() - t0
        timings.append((fault, took))
        print(f"fault {i + 1:2d}: {fault}, {len(midway)} upstream(s) mid-update: converged in {took:.1f} s",
              flush=True)
        mid_rollout += bool(midway)
    assert mid_rollout >= 5, "most kills must land during a rolling update, or they test nothing"
    assert cl.core.read_namespaced_config_map("users-notes", namespace).data == {"k": "v"}
    # Nothing orphaned: every pod's ReplicaSet exists and belongs to a Deployment of an upstream, one
    # Service per upstream.
    sets = {r.metadata.name: r for r in cl.apps.list_namespaced_replica_set(namespace).items}
    deps = {d.metadata.name for d in cl.apps.list_namespaced_deployment(namespace).items}
    for pod in cl.core.list_namespaced_pod(namespace).items:
        rs = sets.get(pod.metadata.owner_references[0].name) if pod.metadata.owner_references else None
        assert rs is not None and rs.metadata.owner_references[0].name in deps, f"orphaned pod {pod.metadata.name}"
    services = [s.metadata.name for s in cl.core.list_namespaced_service(namespace).items]
    assert sorted(services) == sorted(f"{n}-vllm" for n in NAMES), services
    assert "Traceback" not in chaos_operator.log(), chaos_operator.log()[-3000:]
    print("converge times (s): " + ", ".join(f"{t:.1f}" for _, t in timings))
