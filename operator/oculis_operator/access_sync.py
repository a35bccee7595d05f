"""Engine access in the operator's I/O shell (the decisions are engine_access's): the upstream's key in
the namespace's Secret oculis-engine-keys (generated once, before the Deployment that reads it is
written) and its NetworkPolicy. Keys are never logged; only their presence is ever reported."""

from __future__ import annotations

import secrets
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from oculis.engine_access import ENGINE_KEYS_SECRET, KEY_BYTES
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import engine_access, render
from oculis_operator.kube import MERGE, Kube

STRATEGIC = "application/strategic-merge-patch+json"


def ensure_key(kube: Kube, namespace: str, name: str, uid: str) -> str | None:
    """Make sure the Secret holds this upstream's key and names it an owner; a line for the log when a key
    was generated, else None."""
    secret = kube._raw(kube.core.read_namespaced_secret, ENGINE_KEYS_SECRET, namespace)
    if secret is None:
        kube._count()
        try:
            body: Any = engine_access.keys_secret(namespace, name, uid, secrets.token_urlsafe(KEY_BYTES))
            kube.core.create_namespaced_secret(namespace, body)  # the client takes plain dicts as bodies
            return f"Generated the engine API key of {name} in Secret {ENGINE_KEYS_SECRET}"
        except ApiException as exc:
            if exc.status != 409:  # another upstream's reconcile created it meanwhile: add to it below
                raise
        secret = kube._raw(kube.core.read_namespaced_secret, ENGINE_KEYS_SECRET, namespace) or {"metadata": {}}
    patch = engine_access.key_patch(secret, name, uid, secrets.token_urlsafe(KEY_BYTES))
    if patch is None:
        return None
    kube._count()
    kube.core.patch_namespaced_secret(ENGINE_KEYS_SECRET, namespace, patch, _content_type=STRATEGIC)
    return f"Generated the engine API key of {name} in Secret {ENGINE_KEYS_SECRET}" if "data" in patch else None


def engine_key(kube: Kube, namespace: str, name: str) -> str | None:
    """The upstream's engine key, for the adapter sync's calls (never logged)."""
    return engine_access.key_from(kube._raw(kube.core.read_namespaced_secret, ENGINE_KEYS_SECRET, namespace), name)


def sync_policy(kube: Kube, namespace: str, name: str, uid: str, spec: GPUUpstreamSpec,
                peers: engine_access.Peers | None) -> str | None:
    """Create or update the upstream's NetworkPolicy (reverting a hand edit); a line for the log when one was
    written. Without `peers` (networkPolicy off in the chart) nothing is read or written: policies left from
    when it was on stay until deleted (`kubectl delete networkpolicy -l app.kubernetes.io/managed-by=oculis`)."""
    if peers is None:
        return None
    net = client.NetworkingV1Api(kube.api)
    policy_name = render.workload_name(name)
    desired = engine_access.network_policy(name, namespace, uid, spec, peers)
    live = kube._raw(net.read_namespaced_network_policy, policy_name, namespace)
    what = engine_access.policy_write(desired, live)
    if what is None:
        return None
    kube._count()
    body: Any = desired
    try:
        if what == "create":
            net.create_namespaced_network_policy(namespace, body)
        else:  # a merge patch replaces the lists whole: the spec becomes exactly ours
            net.patch_namespaced_network_policy(policy_name, namespace, {"spec": body["spec"]}, _content_type=MERGE)
    except ApiException as exc:
        if exc.status not in (404, 409):  # gone or created meanwhile: the next reconcile looks again
            raise
        return None
    return f"{'Created' if what == 'create' else 'Reverted'} NetworkPolicy {policy_name}"
