"""Who may reach and call a self-hosted engine: the NetworkPolicy of each GPUUpstream's pods and the API
key its engine takes (the shared facts are in oculis.engine_access). Pure.

The NetworkPolicy `<name>-vllm` selects the upstream's engine pods (stable and canary) and lists who may
connect to them: the router pods (engine port, and the KV-events port when the engines publish), the
operator pods (the LoRA adapter sync calls each engine), the monitoring namespace (Prometheus scrapes
/metrics on the engine port) and the chart's extra peers (e.g. a Gateway's endpoint picker and proxy). A
policy that selects a pod denies every ingress it does not list, so no deny rule is written.
Kubelet probes (/health) come from the node: Calico, Cilium and most other CNIs always let a node reach its
own pods, whatever the policies; on a CNI that does not, add the nodes' CIDR to networkPolicy.extraFrom as
an ipBlock. /health shares the engine's port with /v1, so no port-level rule could open one and not the
other: the API key is what guards /v1.

Which pods are the router and the operator comes from the chart (OCULIS_NETWORK_POLICY, `Peers`): the
operator cannot see its own release's labels or the monitoring stack's namespace.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import Field, ValidationError

from oculis.base import Model, format_errors
from oculis.engine_access import ENGINE_KEYS_SECRET
from oculis.router_upstream import KV_EVENTS_PORT
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import render
from oculis_operator.engine_args import PORT, publishes_kv_events

POLICY_ENV = "OCULIS_NETWORK_POLICY"  # JSON of `Peers`; unset or empty: no NetworkPolicy is rendered


class PodsIn(Model):
    """Pods of one namespace, by their labels."""

    namespace: str = Field(min_length=1)
    labels: dict[str, str] = Field(min_length=1)


class Peers(Model):
    """Who may reach the engines, as the chart knows it (values networkPolicy, the release's own labels)."""

    router: PodsIn
    operator: PodsIn
    monitoring_namespace_labels: dict[str, str] | None = None
    """Prometheus's namespace, by its labels (e.g. kubernetes.io/metadata.name: monitoring); None: no scrapes"""
    extra_from: list[dict[str, Any]] = Field(default_factory=list)
    """More NetworkPolicyPeers let into the engine port (a Gateway's proxy and endpoint picker)"""


def parse_peers(text: str | None) -> Peers | None:
    """The chart's setting, or None when unset. A bad one is a ValueError of one line naming the fix."""
    if not text or not text.strip():
        return None
    try:
        return Peers.model_validate(json.loads(text))
    except (ValueError, ValidationError) as exc:
        why = format_errors(exc).replace("\n", "; ") if isinstance(exc, ValidationError) else str(exc)
        raise ValueError(f"{POLICY_ENV}: {why}; the chart renders it from values networkPolicy "
                         "(helm template shows it)") from None


def _peer(pods: PodsIn) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": pods.namespace}},
            "podSelector": {"matchLabels": dict(pods.labels)}}


def pod_selector(name: str) -> dict[str, Any]:
    """The upstream's engine pods, stable and canary (both carry these labels)."""
    return {"matchLabels": {render.UPSTREAM_LABEL: name, "app.kubernetes.io/managed-by": "oculis"}}


def network_policy(name: str, namespace: str, uid: str, spec: GPUUpstreamSpec, peers: Peers) -> dict[str, Any]:
    engine = [{"protocol": "TCP", "port": PORT}]
    ingress: list[dict[str, Any]] = [
        {"from": [_peer(peers.router), _peer(peers.operator), *peers.extra_from], "ports": engine}]
    if publishes_kv_events(spec):  # the router subscribes to each engine's ZMQ publisher
        ingress.append({"from": [_peer(peers.router)], "ports": [{"protocol": "TCP", "port": KV_EVENTS_PORT}]})
    if peers.monitoring_namespace_labels:
        ingress.append({"from": [{"namespaceSelector": {"matchLabels": dict(peers.monitoring_namespace_labels)}}],
                        "ports": engine})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": render.workload_name(name), "namespace": namespace, "labels": render.labels(name),
                     "ownerReferences": [render.owner_ref(name, uid)]},
        "spec": {"podSelector": pod_selector(name), "policyTypes": ["Ingress"], "ingress": ingress},
    }


def policy_write(desired: dict[str, Any], live: dict[str, Any] | None) -> str | None:
    """"create", "patch" (its spec differs: a hand edit, or new chart values) or None."""
    if live is None:
        return "create"
    return "patch" if live.get("spec") != desired["spec"] else None


def _owner(name: str, uid: str) -> dict[str, Any]:
    # Not the controller: the Secret holds every upstream's key of the namespace, so each one owns it and
    # it is garbage-collected with the last of them.
    return {**render.owner_ref(name, uid), "controller": False, "blockOwnerDeletion": False}


def keys_secret(namespace: str, name: str, uid: str, key: str) -> dict[str, Any]:
    """The namespace's key Secret, created with the first keyed upstream's key."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": ENGINE_KEYS_SECRET, "namespace": namespace,
                         "labels": {"app.kubernetes.io/managed-by": "oculis",
                                    "app.kubernetes.io/component": "engine-keys"},
                         "ownerReferences": [_owner(name, uid)]},
            "data": {name: base64.b64encode(key.encode()).decode()}}


def key_patch(secret: dict[str, Any], name: str, uid: str, new_key: str) -> dict[str, Any] | None:
    """A strategic merge patch adding this upstream's key (only if it has none: a key is generated once and
    kept, since running engines hold it) and its owner reference; None when both are there. Strategic merge
    adds to `data` and merges ownerReferences by uid, so concurrent reconciles of two upstreams never drop
    each other's."""
    has_key = name in (secret.get("data") or {})
    owned = uid in {o.get("uid") for o in secret["metadata"].get("ownerReferences") or []}
    if has_key and owned:
        return None
    patch: dict[str, Any] = {"metadata": {"ownerReferences": [_owner(name, uid)]}}
    if not has_key:
        patch["data"] = {name: base64.b64encode(new_key.encode()).decode()}
    return patch


def key_from(secret: dict[str, Any] | None, name: str) -> str | None:
    """The upstream's key in the Secret as read from the API, or None."""
    value = ((secret or {}).get("data") or {}).get(name)
    if not value:
        return None
    try:
        return base64.b64decode(value).decode() or None
    except (ValueError, UnicodeDecodeError):
        return None
