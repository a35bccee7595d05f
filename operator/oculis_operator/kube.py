"""The only module that talks to the Kubernetes API (through the official client). Thin: reads
observed state as plain dicts, creates, patches; counts its requests for the benchmark."""

from __future__ import annotations

import contextvars
import json
import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import adapter_loading, render

GROUP, VERSION, PLURAL = "oculis.dev", "v1alpha1", "gpuupstreams"
# Our patches are JSON merge patches (drift.revert_patch): lists replaced whole and null removing a key,
# which the client's default (strategic merge: env and other keyed lists merged) cannot express.
MERGE = "application/merge-patch+json"


def load_client() -> client.ApiClient:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient, on_request: Callable[[], None] | None = None) -> None:
        self.api = api
        self.on_request = on_request  # e.g. a metrics counter's inc
        self.apps = client.AppsV1Api(api)
        self.core = client.CoreV1Api(api)
        self.policy = client.PolicyV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.requests = 0
        self.reconciles = 0
        # Upstreams to reconcile again by name: the last reconcile failed or waits for a Secret.
        self.recheck: set[tuple[str, str]] = set()
        self.recheck_routes: set[str] = set()  # namespaces whose router config failed to render
        self.external: set[tuple[str, str]] = set()  # external upstreams with a Secret reference
        self.last_failure: dict[tuple[str, str], str] = {}  # the failure last reported per upstream
        self.reported: dict[tuple[str, str], dict[str, str]] = {}  # warnings (reason -> message) last posted
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()
        # A kopf handler's context, so reconciles outside handlers (the recheck loop) can post Events.
        self.event_context: contextvars.Context | None = None
        self.pools_applied: dict[tuple[str, str], dict[str, Any]] = {}  # InferencePool specs written, by upstream
        self.no_pool_crd_until = 0.0  # the InferencePool CRD was absent: not asked again before this time
        # Runtime LoRA adapters (adapter_sync): the upstreams serving LoRA and their spec, registered by the
        # reconciles; what their engines held at the last pass; what the passes did, for the next Events.
        self.lora_upstreams: dict[tuple[str, str], GPUUpstreamSpec] = {}
        self.adapter_reports: dict[tuple[str, str], adapter_loading.Report | None] = {}
        self.adapter_log: dict[tuple[str, str], list[str]] = {}
        self.adapter_wake: Callable[[], object] | None = None  # starts a pass now (set by adapter_sync.run)

    def lock_for(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks[(namespace, name)]

    def _count(self) -> None:
        """One API request made: every read and write goes through here, so the total and the
        metrics counter cannot drift apart."""
        self.requests += 1
        if self.on_request is not None:
            self.on_request()

    def _raw(self, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Call a client method returning the JSON body as a dict; None on 404."""
        self._count()
        try:
            resp = call(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = json.loads(resp.data)
        return body

    def upstream(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.custom.get_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, name)

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.apps.read_namespaced_deployment, render.workload_name(name), namespace)

    def canary_deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.apps.read_namespaced_deployment, render.canary_name(name), namespace)

    def canary_service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.core.read_namespaced_service, render.canary_name(name), namespace)

    def delete_canary(self, namespace: str, name: str) -> None:
        """The canary Deployment and its Service (both `<name>-vllm-canary`, only ever ours)."""
        for delete in (self.apps.delete_namespaced_deployment, self.core.delete_namespaced_service):
            self._count()
            try:
                delete(render.canary_name(name), namespace)
            except ApiException as exc:
                if exc.status != 404:  # already gone: fine
                    raise

    def service(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.core.read_namespaced_service, render.workload_name(name), namespace)

    def pdb(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.policy.read_namespaced_pod_disruption_budget, render.workload_name(name), namespace)

    def secret_state(self, namespace: str, name: str, key: str) -> str:
        secret = self._raw(self.core.read_namespaced_secret, name, namespace)  # the value is never logged
        if secret is None:
            return "missing-secret"
        return "ok" if key in (secret.get("data") or {}) or key in (secret.get("stringData") or {}) else "missing-key"

    def gpu_nodes(self, gfd_product: str) -> list[dict[str, Any]]:
        nodes = self._raw(self.core.list_node, label_selector=f"nvidia.com/gpu.product={gfd_product}") or {}
        items: list[dict[str, Any]] = nodes.get("items", [])
        return items

    def gpu_nodes_and_pods(self, gfd_product: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        nodes = self._raw(self.core.list_node, label_selector=f"nvidia.com/gpu.product={gfd_product}") or {}
        pods = (
            self._raw(
                self.core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed"
            )
            or {}
        )
        names = {n["metadata"]["name"] for n in nodes.get("items", [])}
        return nodes.get("items", []), [p for p in pods.get("items", []) if p.get("spec", {}).get("nodeName") in names]

    def pending_reasons(self, namespace: str, name: str) -> list[str]:
        pods = (
            self._raw(self.core.list_namespaced_pod, namespace, label_selector=f"{render.UPSTREAM_LABEL}={name}") or {}
        )
        reasons = []
        for pod in pods.get("items", []):
            for c in pod.get("status", {}).get("conditions", []) or []:
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    reasons.append(f"pod {pod['metadata']['name']} unschedulable: {c.get('message', '')}")
        return reasons

    def engine_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The upstream's engine pods, stable and canary (both carry the upstream label)."""
        pods = self._raw(self.core.list_namespaced_pod, namespace, label_selector=f"{render.UPSTREAM_LABEL}={name}")
        items: list[dict[str, Any]] = (pods or {}).get("items", [])
        return items

    def create(self, body: Any) -> None:  # the client takes plain dicts as bodies
        ns, kind = body["metadata"]["namespace"], body["kind"]
        self._count()
        try:
            if kind == "Deployment":
                self.apps.create_namespaced_deployment(ns, body)
            elif kind == "Service":
                self.core.create_namespaced_service(ns, body)
            elif kind == "PodDisruptionBudget":
                self.policy.create_namespaced_pod_disruption_budget(ns, body)
            else:
                raise ValueError(f"unexpected kind {kind}")
        except ApiException as exc:
            if exc.status != 409:  # created meanwhile by a concurrent reconcile: fine
                raise

    def apply_inference_pool(self, body: dict[str, Any], now: float) -> str:
        """Create or update the upstream's InferencePool where the cluster has the CRD: "applied",
        "unchanged" (as last written), or "absent" (no such CRD: skipped, asked again in 5 minutes)."""
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if self.pools_applied.get(key) == body["spec"]:
            return "unchanged"
        if now < self.no_pool_crd_until:
            return "absent"
        group, version, plural = render.INFERENCE_POOL
        self._count()
        try:
            self.custom.create_namespaced_custom_object(group, version, meta["namespace"], plural, body)
        except ApiException as exc:
            if exc.status == 404:  # the CRD is not installed
                self.no_pool_crd_until = now + 300
                return "absent"
            if exc.status != 409:
                raise
            self._count()
            self.custom.patch_namespaced_custom_object(group, version, meta["namespace"], plural, meta["name"],
                                                       {"spec": body["spec"]}, _content_type=MERGE)
        self.pools_applied[key] = body["spec"]
        return "applied"

    def patch_deployment(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self._count()
        self.apps.patch_namespaced_deployment(render.workload_name(name), namespace, patch, _content_type=MERGE)

    def patch_workload(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A JSON merge patch of the Service or PodDisruptionBudget we made (drift.revert_patch)."""
        self._count()
        call = (self.core.patch_namespaced_service if kind == "Service"
                else self.policy.patch_namespaced_pod_disruption_budget)
        call(render.workload_name(name), namespace, patch, _content_type=MERGE)

    def patch_status(self, namespace: str, name: str, status: dict[str, Any], plural: str = PLURAL) -> None:
        self._count()
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, plural, name, {"status": status})

    def list_custom(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        body = self._raw(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, plural) or {}
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._raw(self.core.read_namespaced_config_map, name, namespace)

    def config_maps(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        body = self._raw(self.core.list_namespaced_config_map, namespace, label_selector=label_selector) or {}
        items: list[dict[str, Any]] = body.get("items", [])
        return items

    def apply_config_map(
        self, namespace: str, name: str, data: dict[str, str], annotations: dict[str, str], exists: bool,
        labels: dict[str, str] | None = None, owners: list[dict[str, Any]] | None = None,
    ) -> None:
        """Create, or replace whole (so a hand edit of anything we set is undone)."""
        self._count()
        body: Any = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": annotations,
                "labels": labels or {"app.kubernetes.io/managed-by": "oculis",
                                     "app.kubernetes.io/component": "router-config"},
                "ownerReferences": owners or [],
            },
            "data": data,
        }
        if exists:
            self.core.replace_namespaced_config_map(name, namespace, body)
        else:
            self.core.create_namespaced_config_map(namespace, body)

    def delete_config_map(self, namespace: str, name: str) -> None:
        self._count()
        try:
            self.core.delete_namespaced_config_map(name, namespace)
        except ApiException as exc:
            if exc.status != 404:  # already gone (garbage-collected with its last route): fine
                raise
