"""An InferenceRoute's verifier (spec.escalation.onAnswer.verifier.upstream) on the real control plane:
the operator renders its GPUUpstream into the router ConfigMap with the tiers' upstreams."""

from __future__ import annotations

import json
from typing import Any, cast

from e2e_support import eventually
from kubernetes import client

from oculis import parse_config

G, V = "oculis.dev", "v1alpha1"
CM = "oculis-router-config"
KEPT = "the router keeps serving this route's last good config"


def external(name: str, provider: str = "openai-compatible", **spec: Any) -> dict[str, Any]:
    # No request is sent anywhere: the test reads the rendered config only.
    body = {"provider": provider, "model": f"model-{name}", **spec}
    if provider == "openai-compatible":
        body["baseURL"] = "http://127.0.0.1:9/v1"
    return {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": name}, "spec": body}


def graded_route(name: str, verifier: str) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "InferenceRoute", "metadata": {"name": name},
            "spec": {"tiers": [{"name": "only", "match": {}, "upstream": "small"}],
                     "escalation": {"onAnswer": {"verifier": {"upstream": verifier, "minScore": 7}}}}}


def test_a_routes_verifier_upstream_is_rendered_into_the_router_config(api: client.ApiClient, namespace: str,
                                                                       operator: Any) -> None:
    custom, core, ns = client.CustomObjectsApi(api), client.CoreV1Api(api), namespace
    core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name="judge-key"),
                                                      string_data={"api-key": "sk-x"}))
    for body in (external("small"), external("judge", "openai", apiKeySecretRef={"name": "judge-key"}),
                 external("grumpy", "openai", apiKeySecretRef={"name": "no-such-secret"})):
        custom.create_namespaced_custom_object(G, V, ns, "gpuupstreams", body)
    for name, verifier in (("graded", "judge"), ("unkeyed", "grumpy"), ("ghostly", "ghost")):
        custom.create_namespaced_custom_object(G, V, ns, "inferenceroutes", graded_route(name, verifier))

    def ready(name: str) -> dict[str, Any]:
        obj = cast(dict[str, Any], custom.get_namespaced_custom_object(G, V, ns, "inferenceroutes", name))
        return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})

    def ready_when(name: str, says: str) -> dict[str, Any]:
        """The route's Ready condition once its reason or message has `says`, else {} (not yet)."""
        c = ready(name)
        return c if says in (c.get("reason", ""), *c.get("message", "").split("; ")) else {}

    def config() -> tuple[Any, list[dict[str, Any]]]:
        data = core.read_namespaced_config_map(CM, ns).data or {}
        return parse_config(data["oculis-config.yaml"], "configmap"), json.loads(data["secret-env.json"])

    assert eventually(lambda: ready("graded").get("status") == "True", what="graded Ready")
    # Its verifier is not Ready (its Secret is missing): rendered all the same, the status saying so.
    unkeyed = eventually(lambda: ready_when("unkeyed", "UpstreamNotReady"), what="unkeyed UpstreamNotReady")
    assert "grumpy (SecretNotFound)" in unkeyed["message"] and "ungraded" in unkeyed["message"]
    # The printer column counts the verifier with the tiers' upstreams: 1 of 2 answer.
    assert eventually(lambda: custom.get_namespaced_custom_object(G, V, ns, "inferenceroutes", "unkeyed")
                      ["status"].get("upstreamsReady") == "1/2", what="unkeyed upstreamsReady 1/2")
    # A verifier naming no GPUUpstream leaves its route out, naming it.
    ghostly = eventually(lambda: ready_when("ghostly", "UpstreamNotFound"), what="ghostly UpstreamNotFound")
    assert "no GPUUpstream named ghost (the verifier" in ghostly["message"] and "left out" in ghostly["message"]

    cfg, secrets = config()  # written before the statuses above
    assert [r.name for r in cfg.routes] == ["graded", "unkeyed"]  # the router's own parser accepted it
    assert sorted(u.name for u in cfg.upstreams) == ["grumpy", "judge", "small"]
    check = cfg.route("graded").escalation.on_answer
    assert check is not None and check.verifier is not None and check.verifier.upstream == "judge"
    assert {"env": "OCULIS_KEY_JUDGE", "secret": "judge-key", "key": "api-key"} in secrets

    # The verifier's GPUUpstream is deleted: the route keeps its last good config, verifier entry and all.
    custom.delete_namespaced_custom_object(G, V, ns, "gpuupstreams", "judge")
    kept = eventually(lambda: ready_when("graded", KEPT), what="graded keeps its last good config")
    assert kept["reason"] == "UpstreamNotFound" and "judge" in kept["message"]
    cfg, _ = config()
    assert "graded" in [r.name for r in cfg.routes] and cfg.upstream("judge").api_key_env == "OCULIS_KEY_JUDGE"
