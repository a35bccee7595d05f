"""The sandbox behaves like a GPU cluster: labelled, tainted GPU nodes; real scheduling against
`nvidia.com/gpu`; a Deployment's rolling update driven by the real controllers to completion."""

from __future__ import annotations

from typing import Any

from e2e_support import eventually
from kubernetes import client

H100 = "NVIDIA-H100-80GB-HBM3"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_deployment(name: str, gpus: int, replicas: int = 2, product: str = H100) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "tolerations": [GPU_TOLERATION],
                    "containers": [{
                        "name": "engine",
                        "image": "vllm/vllm-openai:v0.11.0",
                        "args": ["--max-num-seqs=64"],
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }],
                },
            },
        },
    }


def test_gpu_nodes_carry_gfd_labels_capacity_and_taint(api: client.ApiClient) -> None:
    nodes = client.CoreV1Api(api).list_node().items
    by_product: dict[str, int] = {}
    for node in nodes:
        labels = node.metadata.labels
        product = labels["nvidia.com/gpu.product"]
        by_product[product] = by_product.get(product, 0) + 1
        assert labels["nvidia.com/gpu.count"] == "8"
        assert int(labels["nvidia.com/gpu.memory"]) > 40000
        assert labels["nvidia.com/gpu.family"] in {"ampere", "hopper"}
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert any(t.key == "nvidia.com/gpu" and t.effect == "NoSchedule" for t in node.spec.taints)
        assert any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
    assert by_product == {"NVIDIA-A100-SXM4-80GB": 2, H100: 2}


def test_gpu_deployment_schedules_on_h100_and_rolls(api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(namespace, gpu_deployment("engine", gpus=1))

    def rolled_out() -> bool:
        d = apps.read_namespaced_deployment("engine", namespace)
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and s.updated_replicas == s.replicas == s.ready_replicas == s.available_replicas == 2
        )

    eventually(rolled_out, what="Deployment ready")
    pods = core.list_namespaced_pod(namespace, label_selector="app=engine").items
    nodes = {n.metadata.name: n for n in core.list_node().items}
    first = {p.metadata.name for p in pods}
    for pod in pods:
        assert nodes[pod.spec.node_name].metadata.labels["nvidia.com/gpu.product"] == H100
        assert pod.status.phase == "Running"

    # Change the pod template as an engine-setting change would: the real controllers roll it.
    apps.patch_namespaced_deployment("engine", namespace, {"spec": {"template": {"spec": {"containers": [
        {"name": "engine", "args": ["--max-num-seqs=128"]}]}}}})
    eventually(rolled_out, what="rolling update complete")

    def only_new_pods() -> bool:
        now = core.list_namespaced_pod(namespace, label_selector="app=engine").items
        return len(now) == 2 and not first & {p.metadata.name for p in now} and all(
            p.spec.containers[0].args == ["--max-num-seqs=128"] for p in now)

    eventually(only_new_pods, what="old pods replaced")


def test_pod_asking_more_gpus_than_free_stays_pending(api: client.ApiClient, namespace: str) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    apps.create_namespaced_deployment(namespace, gpu_deployment("too-big", gpus=9, replicas=1))

    def unschedulable() -> bool:
        pods = core.list_namespaced_pod(namespace, label_selector="app=too-big").items
        return len(pods) == 1 and any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            and "nvidia.com/gpu" in (c.message or "") for c in pods[0].status.conditions or [])

    eventually(unschedulable, what="pod Unschedulable for lack of GPUs")
    pod = core.list_namespaced_pod(namespace, label_selector="app=too-big").items[0]
    assert pod.status.phase == "Pending" and not pod.spec.node_name
