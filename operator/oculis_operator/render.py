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
from oculis.adapters import RUNTIME_LORA_ENV, adapter_volumes
from oculis.engine_access import ENGINE_KEY_ENV, ENGINE_KEYS_SECRET
from oculis.router_upstream import KV_EVENTS_PORT
from oculis.upstream import GPUUpstreamSpec
from oculis_operator.engine_args import PORT, VLLM_IMAGE, publishes_kv_events

ENGINE_HASH = "oculis.dev/engine-hash"
SPEC_HASH = "oculis.dev/spec-hash"
UPSTREAM_LABEL = "oculis.dev/upstream"
TRACK_LABEL = "oculis.dev/track"  # "canary" on the canary Deployment's pods
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


def generate_probe(name: str, timeout_s: int = 30, keyed: bool = False) -> dict[str, Any]:
    """A startup probe that generates one token: vLLM answers /health once the server is up, which can be
    before the first request compiles or loads what it needs, so a rollout would count a replica that
    cannot serve yet. The vLLM image has python3; the request goes to the pod's own port and names the
    served alias, with max_tokens 1 (one decode step, no sampling cost worth the name). `keyed`: the engine
    takes an API key, which the probe sends from the container's own VLLM_API_KEY (never in the pod spec)."""
    body = json.dumps({"model": name, "prompt": "ping", "max_tokens": 1})
    auth = f",'Authorization':'Bearer '+os.environ['{ENGINE_KEY_ENV}']" if keyed else ""
    script = (f"import {'os,' if keyed else ''}sys,urllib.request as u;"
              f"r=u.urlopen(u.Request('http://127.0.0.1:{PORT}/v1/completions',data=sys.argv[1].encode(),"
              f"headers={{'Content-Type':'application/json'{auth}}}),timeout={timeout_s});"
              "sys.exit(0 if b'\"choices\"' in r.read() else 1)")
    return {"exec": {"command": ["python3", "-c", script, body]}, "periodSeconds": 10, "timeoutSeconds": timeout_s}


def engine_key_env(name: str) -> dict[str, Any]:
    """The engine's API key (oculis.engine_access): this upstream's key in the namespace's Secret."""
    return {"name": ENGINE_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ENGINE_KEYS_SECRET, "key": name}}}


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
            "ports": [{"name": "http", "containerPort": PORT}, *(
                [{"name": "kv-events", "containerPort": KV_EVENTS_PORT}] if publishes_kv_events(spec) else [])],
            "resources": resources,
            # vLLM answers /health only once weights, profiling and graphs are done: never a TCP probe.
            # Started = it generated a token; then /health (cheap) keeps it ready and alive.
            "startupProbe": {**generate_probe(name, keyed=spec.engine_api_key),
                             "failureThreshold": startup_failure_threshold(weights_bytes)},
            "readinessProbe": {**probe, "failureThreshold": 3},
            "livenessProbe": {**probe, "failureThreshold": 6},
            "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            "securityContext": {"allowPrivilegeEscalation": False},
        }],
        "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
        "terminationGracePeriodSeconds": 60,
    }
    if spec.lora_enabled:  # only then, so templates without LoRA (and their engine hash) stay as they were
        # The adapter set itself is not in the template when the engine loads adapters at runtime (the
        # operator does, adapter_loading.py): only the volumes of PVC/ConfigMap adapters are, which a pod
        # can mount only when it starts.
        volumes, mounts = adapter_volumes(spec.adapters or [])
        container = pod_spec["containers"][0]
        if spec.runtime_adapters:
            container["env"] = [{"name": RUNTIME_LORA_ENV, "value": "True"}]
        container["volumeMounts"] += mounts
        pod_spec["volumes"] += volumes
    if spec.engine_api_key:  # vLLM reads VLLM_API_KEY as --api-key; the value stays in the Secret
        container = pod_spec["containers"][0]
        container["env"] = [*container.get("env", []), engine_key_env(name)]
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


def annotation(obj: dict[str, Any], key: str) -> str | None:
    """An annotation of a rendered or observed object, or None."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def template_hash(dep: dict[str, Any]) -> str | None:
    """The engine hash (ENGINE_HASH) a Deployment's pod template carries."""
    return annotation(dep.get("spec", {}).get("template", {}), ENGINE_HASH)


def canary_name(name: str) -> str:
    return f"{workload_name(name)}-canary"


# The canary pods' app.kubernetes.io/name: the stable Deployment, Service and PodDisruptionBudget select
# name=vllm, so they never claim, serve or count a canary pod. (Selectors cannot negate, and a new label
# on the stable pod template would restart every engine when the operator is upgraded.)
CANARY_APP = "vllm-canary"


def canary_deployment(stable: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The canary Deployment of a rendered stable one: its pod template (the new engine hash, unchanged:
    the labels below are not part of it), `replicas` replicas, pods labelled name=vllm-canary and
    track=canary, which only the canary Deployment and the canary Service select."""
    dep: dict[str, Any] = json.loads(json.dumps(stable))
    meta, spec = dep["metadata"], dep["spec"]
    name = meta["labels"][UPSTREAM_LABEL]
    meta["name"] = canary_name(name)
    meta["labels"] = {**meta["labels"], TRACK_LABEL: "canary"}
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != SPEC_HASH}
    spec["selector"]["matchLabels"] = canary_selector(name)
    spec["template"]["metadata"]["labels"] = {**spec["template"]["metadata"]["labels"], **canary_selector(name)}
    spec["replicas"] = replicas
    spec["strategy"] = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    return dep


def canary_selector(name: str) -> dict[str, str]:
    return {UPSTREAM_LABEL: name, "app.kubernetes.io/name": CANARY_APP, TRACK_LABEL: "canary"}


def service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": workload_name(name), "namespace": namespace, "labels": labels(name),
                     "ownerReferences": [owner_ref(name, uid)]},
        "spec": {"type": "ClusterIP", "selector": {UPSTREAM_LABEL: name, "app.kubernetes.io/name": "vllm"},
                 "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]},
    }


def canary_service(name: str, namespace: str, uid: str) -> dict[str, Any]:
    """The Service of the canary pods only, which the router sends the canary's share of the traffic
    (routeconfig: the upstream's `canary.base_url`); deleted with the canary Deployment."""
    svc = service(name, namespace, uid)
    svc["metadata"].update(name=canary_name(name), labels={**labels(name), TRACK_LABEL: "canary"})
    svc["spec"]["selector"] = canary_selector(name)
    return svc


# Gateway API Inference Extension: a pool of model-server pods a Gateway routes to (rendered only where
# the cluster has the CRD). No endpointPickerRef: the Oculis router picks for its own traffic. A Gateway that
# should pick through `oculis epp` gets its own pool over the same pods from the chart (templates/epp.yaml,
# epp.pools: selector and port as here; e2e/tests/test_chart_epp.py keeps the two equal).
INFERENCE_POOL = ("inference.networking.k8s.io", "v1", "inferencepools")


def inference_pool(name: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{INFERENCE_POOL[0]}/{INFERENCE_POOL[1]}", "kind": "InferencePool",
        "metadata": {"name": workload_name(name), "namespace": namespace, "labels": labels(name),
                     "ownerReferences": [owner_ref(name, uid)]},
        "spec": {"selector": {"matchLabels": {UPSTREAM_LABEL: name, "app.kubernetes.io/name": "vllm"}},
                 "targetPorts": [{"number": PORT}]},
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


def canary_endpoint(name: str, namespace: str) -> str:
    return f"http://{canary_name(name)}.{namespace}.svc:{PORT}/v1"
