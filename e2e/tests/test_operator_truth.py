"""The operator tells the truth and owns what it made, on the real control plane: hand edits are reverted
and reported once, a model change keeps the router's model name served, names every child object can
carry, GPU requests no node can host are Degraded, and kubectl shows why an upstream is not Ready."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import eventually
from kubernetes import client
from test_gpuupstream import LLAMA_8B, G, P, World, upstream


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def events(world: World, name: str, reason: str) -> list[client.CoreV1Event]:
    return [e for e in world.core.list_namespaced_event(world.ns).items
            if e.reason == reason and e.involved_object.name == name]


def quiet(world: World, name: str) -> tuple[str, ...]:
    """Resource versions of the upstream and everything it owns, for a no-writes check."""
    policy = client.PolicyV1Api(world.core.api_client)
    return (world.get(name)["metadata"]["resourceVersion"], world.deployment(name).metadata.resource_version,
            world.core.read_namespaced_service(f"{name}-vllm", world.ns).metadata.resource_version,
            policy.read_namespaced_pod_disruption_budget(f"{name}-vllm", world.ns).metadata.resource_version)


def test_hand_edits_of_what_the_operator_made_are_reverted_and_reported_once(world: World) -> None:
    # Quantities the API server rewrites (0.5 -> 500m, 1024Mi -> 1Gi) are not edits.
    world.create(upstream("owned", replicas=1, resources={"requests": {"cpu": "0.5", "memory": "1024Mi"}}))
    eventually(lambda: world.ready("owned"), what="Ready")
    time.sleep(1)
    before = quiet(world, "owned")
    time.sleep(3)
    assert quiet(world, "owned") == before  # nothing we render differs from what the API server stored
    args = world.deployment("owned").spec.template.spec.containers[0].args
    policy = client.PolicyV1Api(world.core.api_client)

    # The Deployment: image, args and env edited by hand (as kubectl set image / patch would).
    world.apps.patch_namespaced_deployment("owned-vllm", world.ns, {"spec": {"template": {"spec": {"containers": [
        {"name": "vllm", "image": "evil/image:latest", "args": [*args, "--enforce-eager"],
         "env": [{"name": "INJECTED", "value": "1"}]}]}}}})

    def reverted() -> bool:
        c = world.deployment("owned").spec.template.spec.containers[0]
        # the env back to ours alone: the engine's API key from its Secret
        return c.image == "vllm/vllm-openai:v0.20.0" and c.args == args and [e.name for e in c.env or []] == [
            "VLLM_API_KEY"] and c.env[0].value_from.secret_key_ref.key == "owned"

    eventually(reverted, what="Deployment template reverted")
    found = eventually(lambda: events(world, "owned", "DriftReverted"), what="a DriftReverted event")
    assert "spec.template.spec.containers[0].image" in found[0].message and found[0].type == "Warning"
    assert "containers[0].env" in found[0].message and "containers[0].args" in found[0].message

    # The Service's selector (which left it with no endpoints) and the PDB.
    world.core.patch_namespaced_service("owned-vllm", world.ns, {"spec": {"selector": {"oculis.dev/upstream": "x"}}})
    eventually(lambda: world.core.read_namespaced_service("owned-vllm", world.ns).spec.selector == {
        "oculis.dev/upstream": "owned", "app.kubernetes.io/name": "vllm"}, what="Service selector reverted")
    policy.patch_namespaced_pod_disruption_budget("owned-vllm", world.ns, {"spec": {"maxUnavailable": None,
                                                                                    "minAvailable": 1}},
                                                  _content_type="application/merge-patch+json")

    def pdb_reverted() -> bool:
        spec = policy.read_namespaced_pod_disruption_budget("owned-vllm", world.ns).spec
        return spec.min_available is None and spec.max_unavailable == 1

    eventually(pdb_reverted, what="PDB reverted")
    eventually(lambda: world.ready("owned"), what="Ready again")
    time.sleep(2)
    # One event per hand edit, not one per reconcile (the rollback moves the Deployment many times).
    messages = [e.message for e in events(world, "owned", "DriftReverted")]
    assert len(messages) == 3 and all((e.count or 1) == 1 for e in events(world, "owned", "DriftReverted")), messages
    assert any("Service owned-vllm: spec.selector" in m for m in messages)
    assert any("PodDisruptionBudget owned-vllm: spec.maxUnavailable, spec.minAvailable" in m for m in messages)
    # And the Normal events the operator means to post are there.
    assert any("Created Deployment owned-vllm" in e.message and e.type == "Normal"
               for e in events(world, "owned", "Reconciled"))


def test_a_model_change_keeps_the_routers_model_name_served(world: World) -> None:
    slow = {"oculis.dev/e2e-ready-delay": "4s"}
    world.create(upstream("alias", replicas=1, podAnnotations=slow))
    world.custom.create_namespaced_custom_object(G, "v1alpha1", world.ns, "inferenceroutes", {
        "apiVersion": f"{G}/v1alpha1", "kind": "InferenceRoute", "metadata": {"name": "chat"},
        "spec": {"tiers": [{"name": "all", "match": {}, "upstream": "alias"}]}})
    eventually(lambda: world.ready("alias"), what="Ready")

    def routed_model() -> str:
        cm = world.core.read_namespaced_config_map("oculis-router-config", world.ns)
        doc = yaml.safe_load(cm.data["oculis-config.yaml"])
        return str(next(u for u in doc["oculis"]["upstreams"] if u["name"] == "alias")["model"])

    eventually(lambda: routed_model() == "alias", what="the router asks for the stable alias")
    world.patch("alias", {"model": "Qwen/Qwen3-8B"})
    eventually(lambda: world.get("alias")["status"].get("desiredEngineHash") != world.get("alias")["status"].get(
        "engineHash"), what="rollout started")
    # Mid-rollout, old pods serve [alias, old model] and new pods [alias, new model]: the router's name
    # is served by both.
    assert routed_model() == "alias"
    for pod in world.pods("alias"):
        a = pod.spec.containers[0].args
        assert a[a.index("--served-model-name") + 1] == "alias"
    eventually(lambda: world.ready("alias"), what="rolled")
    a = world.deployment("alias").spec.template.spec.containers[0].args
    assert a[a.index("--served-model-name") + 1: a.index("--served-model-name") + 3] == ["alias", "Qwen/Qwen3-8B"]
    assert routed_model() == "alias"


@pytest.mark.parametrize("name", ["llama.dot", "8b-digit"])
def test_a_name_no_service_can_carry_is_refused_at_apply(world: World, name: str) -> None:
    with pytest.raises(client.ApiException) as err:
        world.custom.create_namespaced_custom_object(G, "v1alpha1", world.ns, P, upstream(name), dry_run="All")
    assert err.value.status == 422 and "DNS-1035" in json.loads(err.value.body)["message"]
    assert not world.apps.list_namespaced_deployment(world.ns).items


@pytest.mark.parametrize(("name", "gpu", "replicas", "reason", "words"), [
    ("sixteen", {"product": "H100-80GB", "count": 16}, 1, "NoNodeCanHost",
     "no node offers 16 nvidia.com/gpu of H100-80GB"),
    ("h200", {"product": "H200-141GB", "count": 1}, 1, "NoNodeCanHost", "no node has nvidia.com/gpu.product"),
    ("many", {"product": "H100-80GB", "count": 8}, 3, "ExceedsPool", "fit at most 2 replicas"),
])
def test_a_gpu_request_no_node_can_host_is_degraded_not_waiting(world: World, bin_dir: Path, kubeconfig: Path,
                                                                name: str, gpu: dict[str, Any], replicas: int,
                                                                reason: str, words: str) -> None:
    # The webhook warns at apply (it does not refuse: a node pool may scale up from zero).
    applied = subprocess.run([str(bin_dir / "kubectl"), "apply", "-n", world.ns, "-f", "-"], capture_output=True,
                             text=True, check=True, input=json.dumps(upstream(name, gpu=gpu, replicas=replicas)),
                             env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert f"Warning: {reason}: " in applied.stderr and words in applied.stderr
    c = eventually(lambda: world.cond(name, "Degraded").get("reason") == reason and world.cond(name, "Degraded"),
                   what=f"Degraded {reason}")
    assert c["status"] == "True" and words in c["message"]
    assert eventually(lambda: events(world, name, reason), what=f"a {reason} event")[0].type == "Warning"
    # kubectl get gu says why in its READY and REASON columns.
    table = subprocess.run([str(bin_dir / "kubectl"), "get", "gu", name, "-n", world.ns], capture_output=True,
                           text=True, check=True, env={**os.environ, "KUBECONFIG": str(kubeconfig)}).stdout
    header, row = table.splitlines()[:2]
    at = header.index(" READY ") + 1  # columns are aligned; the GPU column holds a space
    assert row[at:].split()[:2] == ["False", reason]


def test_kubectl_explain_describes_both_kinds(bin_dir: Path, kubeconfig: Path, crds: None) -> None:
    for kind, words in (("gpuupstreams", "A model served by vLLM"), ("inferenceroutes", "A route of the Oculis")):
        out = subprocess.run([str(bin_dir / "kubectl"), "explain", kind], capture_output=True, text=True, check=True,
                             env={**os.environ, "KUBECONFIG": str(kubeconfig)}).stdout
        assert words in out and "<empty>" not in out.split("FIELDS")[0]


def test_the_model_alias_is_the_upstreams_name(world: World) -> None:
    world.create(upstream("named", replicas=1))
    eventually(lambda: world.get("named").get("status", {}).get("servedModel") == "named", what="servedModel")
    assert world.get("named")["spec"]["model"] == LLAMA_8B
