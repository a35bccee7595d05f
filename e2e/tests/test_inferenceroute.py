"""InferenceRoute -> the router config ConfigMap the router loads, kept in step with the upstreams."""

from __future__ import annotations

import json
from typing import Any

import pytest
from e2e_support import eventually
from kubernetes import client
from test_gpuupstream import World, upstream

from oculis import parse_config

G, V = "oculis.dev", "v1alpha1"


def route(name: str, tiers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": f"{G}/{V}", "kind": "InferenceRoute", "metadata": {"name": name},
            "spec": {"classifier": {"cacheTtlSeconds": 600}, "tiers": tiers,
                     "escalation": {"enabled": True, "confidenceThreshold": 0.6},
                     "cache": {"enabled": True, "ttlSeconds": 600, "onlyWhen": {"temperatureBelow": 0.01}}}}


@pytest.fixture
def world(api: client.ApiClient, namespace: str, operator: Any) -> World:
    return World(api, namespace)


def route_status(world: World, name: str) -> dict[str, Any]:
    obj = world.custom.get_namespaced_custom_object(G, V, world.ns, "inferenceroutes", name)
    return obj.get("status") or {}


def config(world: World) -> dict[str, Any]:
    cm = world.core.read_namespaced_config_map("oculis-router-config", world.ns)
    return {"text": cm.data["oculis-config.yaml"], "secrets": json.loads(cm.data["secret-env.json"])}


def test_route_renders_a_config_the_router_accepts(world: World) -> None:
    world.create(upstream("llama-8b"))
    world.core.create_namespaced_secret(world.ns, client.V1Secret(metadata=client.V1ObjectMeta(name="openai"),
                                                                  string_data={"api-key": "sk-x"}))
    world.create({"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "gpt4o"},
                  "spec": {"provider": "openai", "model": "gpt-4o", "apiKeySecretRef": {"name": "openai"},
                           "promptCache": {"minPrefixTokens": 1024},
                           "pricing": {"inputPerMtok": 2.5, "outputPerMtok": 10}}})
    eventually(lambda: world.ready("llama-8b"), what="upstream Ready")
    # The docs' spelling: rules flat on the tier, no match on the last, the classifier by its older id.
    body = route("adaptive", [
        {"name": "simple", "complexityBelow": 0.35, "maxPromptTokens": 2000, "upstream": "llama-8b"},
        {"name": "complex", "upstream": "gpt4o"}])
    body["spec"]["classifier"]["model"] = "oculis-minilm-static-v1"
    world.custom.create_namespaced_custom_object(G, V, world.ns, "inferenceroutes", body)

    def rendered() -> bool:
        c = route_status(world, "adaptive").get("conditions", [])
        return any(x["type"] == "Ready" and x["status"] == "True" for x in c)

    eventually(rendered, what="route Ready")
    st = route_status(world, "adaptive")
    assert st["tiers"] == "simple->llama-8b, complex->gpt4o" and st["configMap"] == "oculis-router-config"
    cfg = parse_config(config(world)["text"], "configmap")  # the router's own parser accepts it
    r = cfg.route("adaptive")
    assert [t.upstream for t in r.tiers] == ["llama-8b", "gpt4o"] and r.cache.enabled
    assert (r.tiers[0].match.complexity_below, r.tiers[0].match.max_prompt_tokens) == (0.35, 2000)
    assert r.classifier.model == "oculis/router-small-v2"  # one name in the rendered config
    llama = cfg.upstream("llama-8b")
    assert llama.base_url == f"http://llama-8b-vllm.{world.ns}.svc:8000/v1"
    assert llama.revision == world.get("llama-8b")["status"]["engineHash"]
    gpt = cfg.upstream("gpt4o")
    assert gpt.api_key_env == "OCULIS_KEY_GPT4O" and gpt.prompt_cache and gpt.prompt_cache.min_prefix_tokens == 1024
    assert config(world)["secrets"] == [{"env": "OCULIS_KEY_GPT4O", "secret": "openai", "key": "api-key"}]
    assert "sk-x" not in config(world)["text"]

    # A replaced model changes the upstream revision, so the router's cache cannot serve old answers.
    old = llama.revision
    world.patch("llama-8b", {"engine": {"maxNumSeqs": 32}})
    eventually(lambda: parse_config(config(world)["text"]).upstream("llama-8b").revision != old,
               what="revision follows the engine hash")


def test_route_with_a_missing_upstream_is_not_ready_and_left_out(world: World) -> None:
    world.create(upstream("small"))
    eventually(lambda: world.ready("small"), what="Ready")
    world.custom.create_namespaced_custom_object(G, V, world.ns, "inferenceroutes", route("good", [
        {"name": "only", "match": {}, "upstream": "small"}]))
    world.custom.create_namespaced_custom_object(G, V, world.ns, "inferenceroutes", route("broken", [
        {"name": "a", "match": {"complexityBelow": 0.5}, "upstream": "small"},
        {"name": "b", "match": {}, "upstream": "does-not-exist"}]))

    def broken_reason() -> str | None:
        c = route_status(world, "broken").get("conditions", [])
        return next((x["reason"] for x in c if x["type"] == "Ready" and x["status"] == "False"), None)

    assert eventually(broken_reason, what="broken route reported") == "UpstreamNotFound"
    cfg = parse_config(config(world)["text"])
    assert [r.name for r in cfg.routes] == ["good"]
