"""GPUUpstream -> the Deployment, Service and PodDisruptionBudget that serve it. Pure.

The pod template carries `oculis.dev/engine-hash`, a hash of everything that restarts an engine
(image, argv, GPUs, placement); the Deployment carries `oculis.dev/spec-hash` over its whole
desired spec except replicas and strategy, so an unchanged object needs no write and a replica-only
change never restarts pods.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from oculis import gpus
from oculis.upstream import GPUUpstreamSpec
from oculis_operator.engine_args import PORT, VLLM_IMAGE

ENGINE_HASH = "oculis.dev/engine-hash"
SPEC_HASH = "oculis.dev/spec-hash"
UPSTREAM_LABEL = "oculis.dev/upstream"
GPU_TOLERATION = {"key": gpus.GPU_TAINT_KEY, "operator": "Exists", "effect": gpus.GPU_TAINT_EFFECT}


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def workload_name(name: str) -> str:
    return f"{name}-vllm"


def owner_ref(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "oculis.dev/v1alpha1", "kind": "GPUUpstream", "name": name, "uid": uid,
            "controller": True, "blockOwnerDeletion": True}


def labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/managed-by": "oculis", UPSTREAM_LABEL: name}


def startup_failure_threshold(weights_bytes: int) -> int:
    """Probe budget for model load (10 s period): ~60 s + 20 s per GiB of weights per GPU, x3 margin,
    between 5 and 30 minutes (large models on cold caches take that long)."""
    seconds = 3 * (60 + 20 * weights_bytes / 1024**3)
    return max(30, min(180, math.ceil(seconds / 10)))


def pod_template(name: str, spec: GPUUpstreamSpec, argv: list[str], weights_bytes: int) -> dict[str, Any]:
    assert spec.gpu is not None
    product = gpus.lookup(spec.gpu.product)
    gpu_limit = {gpus.GPU_RESOURCE: str(spec.gpu.count)}
    res = spec.resources.model_dump(exclude_none=True) if spec.resources else {}
    resources = {"limits": {**res.get("limits", {}), **gpu_limit}, "requests": {**res.get("requests", {}), **gpu_limit}}
    probe = {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10, "timeoutSeconds": 5}
    tolerations = [GPU_TOLERATION] + [t.model_dump(exclude_none=True) for t in spec.tolerations or []]
    pod_spec: dict[str, Any] = {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": gpus.GPU_PRODUCT_LABEL, "operator": "In",
                                   "values": [product.gfd_product]}]}]}}},
        "tolerations": tolerations,
        "containers": [{
            "name": "vllm",
            "image": spec.image or VLLM_IMAGE,
            "args": argv,
            "ports": [{"name": "http", "containerPort": PORT}],
            "resources": resources,
            # vLLM answers /health only once weights, profiling and graphs are done: never a TCP probe.
            "startupProbe": {**probe, "failureThreshold": startup_failure_threshold(weights_bytes)},
            "readinessProbe": {**probe, "failureThreshold": 3},
            "livenessProbe": {**probe, "failureThreshold": 6},
            "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            "securityContext": {"allowPrivilegeEscalation": False},
        }],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
        "terminationGracePeriodSeconds": 60,
    }
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    template: dict[str, Any] = {"metadata": {"labels": labels(name)}, "spec": pod_spec}
    if spec.pod_annotations:
        template["metadata"]["annotations"] = dict(spec.pod_annotations)
    template["metadata"]["annotations"] = {**template["metadata"].get("annotations", {}),
                                           ENGINE_HASH: digest(template)}
    return template


def deployment(name: str, namespace: str, uid: str, spec: GPUUpstreamSpec, argv: list[str],
               weights_bytes: int, strategy: dict[str, int]) -> dict[str, Any]:
    template = pod_template(name, spec, argv, weights_bytes)
    body: dict[str, Any] = {
        "selector": {"matchLabels": {UPSTREAM_LABEL: name, "app.kubernetes.io/name": "vllm"}},
        "template": template,
        "progressDeadlineSeconds": 3600,
        "revisionHistoryLimit": 5,
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": workload_name(name), "namespace": namespace, "labels": labels(name),
                     "annotations": {SPEC_HASH: digest(body)}, "ownerReferences": [owner_ref(name, uid)]},
        "spec": {**body, "replicas": spec.replicas if spec.replicas is not None else 1,
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": strategy}},
    }


def service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": workload_name(name), "namespace": namespace, "labels": labels(name),
                     "ownerReferences": [owner_ref(name, uid)]},
        "spec": {"type": "ClusterIP", "selector": {UPSTREAM_LABEL: name, "app.kubernetes.io/name": "vllm"},
                 "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }


def pod_disruption_budget(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": workload_name(name), "namespace": namespace, "labels": labels(name),
                     "ownerReferences": [owner_ref(name, uid)]},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {UPSTREAM_LABEL: name,
                                                                    "app.kubernetes.io/name": "vllm"}}},
    }


def endpoint(name: str, namespace: str) -> str:
    return f"http://{workload_name(name)}.{namespace}.svc:{PORT}/v1"
