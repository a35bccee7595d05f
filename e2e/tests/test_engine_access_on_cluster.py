"""Engines only Oculis can reach (issue 35, item 6), on the sandbox's real API server: per GPUUpstream the
operator writes an API key once into the namespace's Secret oculis-engine-keys (owned by each keyed
upstream), points the engine's VLLM_API_KEY at it, and renders a NetworkPolicy that lets only the router,
the operator, the monitoring namespace and the chart's extra peers into the engine port. The sandbox's
engine pods (`oculis sim serve`, run with the pod's env as the kubelet would) then refuse /v1 without the
key and answer /health and /metrics, and the router, given the key as the chart mounts it, serves."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import engine_auth, eventually, oculis_serve
from kubernetes import client
from operator_fixture import SANDBOX_PEERS, free_port
from test_gpuupstream import World, upstream
from test_inferenceroute import route

SECRET = "oculis-engine-keys"
G, V = "oculis.dev", "v1alpha1"


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def keys(world: World) -> dict[str, str]:
    data = world.core.read_namespaced_secret(SECRET, world.ns).data or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def policy(world: World, name: str) -> Any:
    return client.NetworkingV1Api(world.core.api_client).read_namespaced_network_policy(f"{name}-vllm", world.ns)


def peer(pods: dict[str, Any]) -> dict[str, Any]:
    return {"namespace_selector": {"match_expressions": None,
                                   "match_labels": {"kubernetes.io/metadata.name": pods["namespace"]}},
            "pod_selector": {"match_expressions": None, "match_labels": pods["labels"]}, "ip_block": None}


def test_each_upstream_gets_a_key_once_its_engine_reads_it_from_the_secret_and_a_policy_guards_its_port(
        world: World) -> None:
    world.create(upstream("llm", replicas=1))
    world.create(upstream("open", replicas=1, access={"apiKey": False}))
    dep = eventually(lambda: world.deployment("llm"), what="the Deployment")
    uid = world.get("llm")["metadata"]["uid"]

    # The engine's key: an env var from the Secret's key named after the upstream, never a literal or an arg.
    env = {e.name: e for e in dep.spec.template.spec.containers[0].env or []}
    ref = env["VLLM_API_KEY"].value_from.secret_key_ref
    assert (ref.name, ref.key, env["VLLM_API_KEY"].value) == (SECRET, "llm", None)
    first = eventually(lambda: keys(world).get("llm"), what="the key in the Secret")
    assert len(first) >= 40 and not any(first in a for a in dep.spec.template.spec.containers[0].args)
    owners = {o.uid: o for o in world.core.read_namespaced_secret(SECRET, world.ns).metadata.owner_references}
    assert owners[uid].kind == "GPUUpstream" and owners[uid].controller is False  # shared: each keyed upstream owns it

    # Opted out: no key, no env; still a policy.
    open_dep = eventually(lambda: world.deployment("open"), what="the opted-out Deployment")
    assert "VLLM_API_KEY" not in {e.name for e in open_dep.spec.template.spec.containers[0].env or []}
    assert "open" not in keys(world)

    # Never regenerated: a second keyed upstream adds its own key, and a spec change of the first keeps its.
    world.create(upstream("other", replicas=1))
    eventually(lambda: "other" in keys(world), what="the second upstream's key")
    world.patch("llm", {"replicas": 2})
    eventually(lambda: world.deployment("llm").spec.replicas == 2, what="scaled")
    assert keys(world)["llm"] == first and keys(world)["other"] != first

    # The NetworkPolicy: owned by the upstream, selects its engine pods (stable and canary), lets in only
    # the router and the operator (and the chart's extra peers) on the engine port, and the monitoring
    # namespace for scrapes; everything else is denied by being selected.
    np = eventually(lambda: policy(world, "llm"), what="the NetworkPolicy")
    assert [(o.kind, o.name, o.uid, o.controller) for o in np.metadata.owner_references] == [
        ("GPUUpstream", "llm", uid, True)]
    assert np.spec.pod_selector.match_labels == {"oculis.dev/upstream": "llm", "app.kubernetes.io/managed-by": "oculis"}
    pod_labels = dep.spec.template.metadata.labels
    assert all(pod_labels[k] == v for k, v in np.spec.pod_selector.match_labels.items())
    assert np.spec.policy_types == ["Ingress"]
    engine, monitoring = np.spec.ingress
    assert [(p.port, p.protocol) for p in engine.ports] == [(8000, "TCP")]
    peers = [p.to_dict() for p in engine._from]
    assert peers[:2] == [peer(SANDBOX_PEERS["router"]), peer(SANDBOX_PEERS["operator"])]
    assert peers[2]["namespace_selector"]["match_labels"] == {"kubernetes.io/metadata.name": "gateway"}
    assert [p.namespace_selector.match_labels for p in monitoring._from] == [
        {"kubernetes.io/metadata.name": "monitoring"}]
    assert [p.port for p in monitoring.ports] == [8000]

    # A hand edit of the policy is reverted at the upstream's next reconcile.
    net = client.NetworkingV1Api(world.core.api_client)
    net.patch_namespaced_network_policy("llm-vllm", world.ns, {"spec": {"ingress": [{}]}})  # {} = allow all
    world.patch("llm", {"replicas": 1})
    eventually(lambda: len(policy(world, "llm").spec.ingress) == 2 and policy(world, "llm").spec.ingress[0]._from,
               what="the policy reverted")
    # The opted-out upstream's engine is still behind its own policy.
    assert policy(world, "open").spec.pod_selector.match_labels["oculis.dev/upstream"] == "open"


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed")
def test_sandbox_engines_refuse_v1_without_the_key_and_the_router_serves_with_it(
        world: World, served: dict[str, Any], tmp_path: Path) -> None:
    ns, endpoints = world.ns, Path(served["endpoints"])
    host = f"llm-vllm.{ns}.svc"
    world.create(upstream("llm", replicas=1, engine={"maxModelLen": 8192, "maxNumSeqs": 32,
                                                     "maxNumBatchedTokens": 4096, "gpuMemoryUtilization": 0.9}))
    world.custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", route("chat", [
        {"name": "only", "match": {}, "upstream": "llm"}]))
    eventually(lambda: world.ready("llm"), timeout=120, what="upstream Ready")
    port = eventually(lambda: json.loads(endpoints.read_text()).get(host, {}).get("ports", [None])[0],
                      what="the pod's simulator")
    engine = f"http://127.0.0.1:{port}"
    auth = engine_auth(endpoints, "llm")
    assert auth["Authorization"] == f"Bearer {keys(world)['llm']}"
    body = {"model": "llm", "prompt": "hi", "max_tokens": 2}
    assert httpx.post(f"{engine}/v1/completions", json=body, timeout=30).status_code == 401
    assert httpx.post(f"{engine}/v1/completions", json=body, timeout=30,
                      headers={"Authorization": "Bearer not-the-key"}).status_code == 401
    assert httpx.post(f"{engine}/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/x"},
                      timeout=30).status_code == 401
    assert httpx.get(f"{engine}/health", timeout=10).status_code == 200  # probes and scrapes need no key
    assert httpx.get(f"{engine}/metrics", timeout=10).status_code == 200
    assert httpx.post(f"{engine}/v1/completions", json=body, timeout=30, headers=auth).status_code == 200

    # The router the operator configured names the key (a file in its engine-keys directory) and serves.
    def rendered() -> str:
        text = (world.core.read_namespaced_config_map("oculis-router-config", ns).data or {})["oculis-config.yaml"]
        return text if host in text else ""

    text = eventually(rendered, what="the route's router config")
    assert "api_key_file: llm" in text and keys(world)["llm"] not in text
    (tmp_path / "oculis-config.yaml").write_text(text)
    with oculis_serve(tmp_path / "oculis-config.yaml", endpoints, tmp_path / "router.log", free_port()) as url:
        r = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": "chat", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]})
        assert r.status_code == 200, r.text
    assert keys(world)["llm"] not in (tmp_path / "router.log").read_text()
