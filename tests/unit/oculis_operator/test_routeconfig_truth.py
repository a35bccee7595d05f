"""The router ConfigMap tells the truth: it holds exactly the routes that name it and can be served,
a bad upstream or a bad route costs only the routes it touches, and names cannot shadow each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from starlette.testclient import TestClient

from oculis import ConfigError, parse_config
from oculis.crdgen import gpuupstream_crd, inferenceroute_crd
from oculis.inferenceroute import SAME_NAMESPACE, InferenceRouteSpec
from oculis.upstream import COMPATIBLE_NEEDS_URL, GPUUpstreamSpec
from oculis_operator import routeconfig, router_configmap


def gu(name: str, provider: str = "vllm", **spec: Any) -> dict[str, Any]:
    body = {"provider": provider, "model": f"model-{name}", **spec}
    if provider == "vllm":
        body["gpu"] = {"product": "H100-80GB", "count": 1}
    return {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": body,
            "status": {"engineHash": f"h-{name}", "conditions": [{"type": "Ready", "status": "True",
                                                                  "reason": "AllReplicasReady"}]}}


def ir(name: str, *upstreams: str, config_map: str | None = None, **meta: Any) -> dict[str, Any]:
    tiers = [{"name": f"t{i}", "match": {"complexityBelow": 0.5}, "upstream": u} for i, u in enumerate(upstreams)]
    tiers[-1]["match"] = {}
    spec: dict[str, Any] = {"tiers": tiers, **({"configMap": config_map} if config_map else {})}
    return {"apiVersion": "oculis.dev/v1alpha1", "kind": "InferenceRoute",
            "metadata": {"name": name, "namespace": "ns", "generation": 1, "uid": f"uid-{name}", **meta},
            "spec": spec}


def routes_in(out: routeconfig.Rendered) -> list[str]:
    return [r.name for r in parse_config(out.data[router_configmap.CONFIG_KEY]).routes]


def test_a_config_map_whose_routes_cannot_be_served_holds_the_empty_config(tmp_path: Path) -> None:
    # The only route names a missing upstream and no previous rendering holds it: the ConfigMap must
    # not serve it (with one, the route keeps its last good block: the tests below).
    out = routeconfig.render_namespace([ir("solo", "gone")], [], previous=None)
    assert out.routes["solo"].reason == "UpstreamNotFound" and "left out" in out.routes["solo"].message
    assert yaml.safe_load(out.data[router_configmap.CONFIG_KEY]) == routeconfig.EMPTY
    assert out.owners == [{"apiVersion": "oculis.dev/v1alpha1", "kind": "InferenceRoute", "name": "solo",
                           "uid": "uid-solo"}]
    # The router itself loads that config, is ready, and answers 404 for the route that left it.
    from oculis_router.app import build_app

    path = tmp_path / "oculis-config.yaml"
    path.write_text(out.data[router_configmap.CONFIG_KEY])
    with TestClient(build_app(config_path=path, wait_for_config=True)) as client:
        assert client.get("/readyz").status_code == 200
        resp = client.post("/v1/chat/completions", json={"model": "solo", "messages": [{"role": "user",
                                                                                        "content": "x"}]})
        assert resp.status_code == 404 and resp.json()["error"]["type"] == "invalid_request_error"


def test_each_config_map_holds_only_the_routes_that_name_it() -> None:
    outs = routeconfig.render_config_maps(
        [ir("a", "small"), ir("b", "large", config_map="other-config"), ir("c", "small", config_map="other-config")],
        [gu("small"), gu("large")])
    assert sorted(outs) == ["oculis-router-config", "other-config"]
    assert routes_in(outs["oculis-router-config"]) == ["a"]
    assert [u.name for u in parse_config(outs["oculis-router-config"].data[router_configmap.CONFIG_KEY]).upstreams] == [
        "small"]
    assert routes_in(outs["other-config"]) == ["b", "c"]
    assert [o["name"] for o in outs["other-config"].owners] == ["b", "c"]
    assert set(outs["oculis-router-config"].routes) == {"a"}  # each route's verdict comes from its own ConfigMap


def test_a_route_being_deleted_is_already_out_of_its_config_map() -> None:
    going = ir("b", "small", deletionTimestamp="2026-12-01T00:00:00Z")
    outs = routeconfig.render_config_maps([ir("a", "small"), going], [gu("small")])
    assert routes_in(outs["oculis-router-config"]) == ["a"]
    assert [o["name"] for o in outs["oculis-router-config"].owners] == ["a"]
    # With no route left to name it, nothing is desired: the handler deletes the live ConfigMap.
    assert routeconfig.render_config_maps([going], [gu("small")]) == {}


def test_a_broken_upstream_breaks_only_the_routes_that_use_it() -> None:
    # An upstream that slipped past the schema (stored before the CEL rule) and one route over it.
    upstreams = [gu("small"), gu("compat", "openai-compatible")]
    out = routeconfig.render_namespace([ir("r", "small"), ir("uses-compat", "small", "compat")], upstreams)
    assert out.routes["r"].ready and out.routes["r"].reason == "Rendered"
    bad = out.routes["uses-compat"]
    assert not bad.ready and bad.reason == "InvalidUpstream"
    assert "GPUUpstream compat" in bad.message and "base_url" in bad.message and "left out" in bad.message
    assert routes_in(out) == ["r"]
    assert [u.name for u in parse_config(out.data[router_configmap.CONFIG_KEY]).upstreams] == ["small"]


def test_a_route_the_router_would_refuse_costs_only_that_route() -> None:
    # A dotted name is a valid object name but not a router route name (clients send it as `model`).
    out = routeconfig.render_namespace([ir("good", "small"), ir("dotted.name", "small")], [gu("small")])
    assert out.routes["good"].ready and routes_in(out) == ["good"]
    assert out.routes["dotted.name"].reason == "InvalidName"
    assert "metadata.name 'dotted.name' cannot be a route name" in out.routes["dotted.name"].message


def test_openai_compatible_upstreams_need_a_base_url_at_apply() -> None:
    with pytest.raises(ValidationError, match="baseURL is required when provider is openai-compatible"):
        GPUUpstreamSpec.model_validate({"provider": "openai-compatible", "model": "m"})
    GPUUpstreamSpec.model_validate({"provider": "openai-compatible", "model": "m", "baseURL": "http://h:8000/v1"})
    rules = gpuupstream_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    assert any(r["message"] == COMPATIBLE_NEEDS_URL and "baseURL" in r["rule"] for r in rules)


def test_a_route_and_an_upstream_cannot_share_a_name() -> None:
    out = routeconfig.render_namespace([ir("llama-8b", "gpt4o"), ir("other", "gpt4o")],
                                       [gu("llama-8b"), gu("gpt4o", "openai")])
    assert out.routes["llama-8b"].reason == "NameCollision" and not out.routes["llama-8b"].ready
    assert "GPUUpstream named llama-8b" in out.routes["llama-8b"].message
    assert out.routes["other"].ready and routes_in(out) == ["other"]
    # The router's own schema refuses such a config too (it would look the upstream up first).
    text = yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "llama-8b", "provider": "openai", "model": "m"}],
        "routes": [{"name": "llama-8b", "tiers": [{"name": "a", "match": {}, "upstream": "llama-8b"}]}]}})
    with pytest.raises(ConfigError, match=r"a route and an upstream cannot share a name.*llama-8b"):
        parse_config(text)


@pytest.mark.parametrize(("upstream", "says"), [
    ("odd/8b-digit", SAME_NAMESPACE),
    ("8b-digit", "must be a GPUUpstream name"),
    ("Llama", "must be a GPUUpstream name"),
])
def test_tier_upstreams_are_object_names_in_the_routes_namespace(upstream: str, says: str) -> None:
    with pytest.raises(ValidationError, match=says.replace("(", r"\(")):
        InferenceRouteSpec.model_validate({"tiers": [{"name": "a", "match": {}, "upstream": upstream}]})
    # ... and the CRD refuses it at `kubectl apply`, saying why for a namespace/ prefix.
    tier = inferenceroute_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["tiers"]["items"]["properties"]["upstream"]
    assert tier["pattern"] == "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
    assert tier["x-kubernetes-validations"] == [{"rule": "!self.contains('/')", "message": SAME_NAMESPACE}]


def live(out: routeconfig.Rendered, **meta: Any) -> dict[str, Any]:
    """The ConfigMap as the operator writes it (what the API server then returns)."""
    return {"metadata": {"name": "oculis-router-config", "labels": dict(router_configmap.LABELS),
                         "annotations": {router_configmap.HASH_ANNOTATION: out.digest},
                         "ownerReferences": out.owners, "resourceVersion": "7", **meta},
            "data": dict(out.data)}


def test_the_live_config_map_is_compared_whole_so_hand_edits_are_reverted() -> None:
    out = routeconfig.render_namespace([ir("a", "small")], [gu("small")])
    assert routeconfig.config_map_drift(live(out), out) is None
    assert routeconfig.config_map_drift(None, out) == "missing"
    edited = live(out)
    edited["data"][router_configmap.CONFIG_KEY] += "# hand edit\n"
    assert routeconfig.config_map_drift(edited, out) == "edited by hand"
    # A ConfigMap written for older routes is out of date, not edited by hand.
    older = routeconfig.render_namespace([ir("a", "small"), ir("b", "small")], [gu("small")])
    assert routeconfig.config_map_drift(live(older), out) == "routes changed"
    assert routeconfig.config_map_drift(live(out, ownerReferences=[]), out) == "owners changed"
    assert routeconfig.config_map_drift(live(out, labels={}), out) == "labels or annotations edited by hand"


def test_a_route_whose_upstream_vanished_keeps_serving_its_last_good_config(tmp_path: Path) -> None:
    upstreams = [gu("small"), gu("big", "openai", apiKeySecretRef={"name": "openai-key"})]
    before = routeconfig.render_namespace([ir("r", "small", "big"), ir("other", "small")], upstreams)
    assert before.routes["r"].ready and routes_in(before) == ["other", "r"]
    # The upstream of tier t1 is deleted: the route stays in the ConfigMap, with the vanished upstream's
    # last entry and its Secret env, so tier t0 still answers and t1 fails over by escalation.
    out = routeconfig.render_namespace([ir("r", "small", "big"), ir("other", "small")], [gu("small")],
                                       previous=before.data)
    verdict = out.routes["r"]
    assert (verdict.ready, verdict.degraded, verdict.reason) == (False, True, "UpstreamNotFound")
    assert verdict.message == ("no GPUUpstream named big in this namespace; "
                               "the router keeps serving this route's last good config")
    assert [t["ready"] for t in verdict.tier_status] == [True, False]
    assert routes_in(out) == ["other", "r"]
    assert out.data == before.data
    assert json.loads(out.data[router_configmap.SECRETS_KEY]) == [
        {"env": "OCULIS_KEY_BIG", "secret": "openai-key", "key": "api-key"}]
    # The carried-over content is what is desired: rendering again over it writes nothing.
    again = routeconfig.render_namespace([ir("r", "small", "big"), ir("other", "small")], [gu("small")],
                                         previous=router_configmap.written_data(live(out)))
    assert again.data == out.data and routeconfig.config_map_drift(live(out), again) is None
    # The router loads it and serves the route.
    path = tmp_path / "oculis-config.yaml"
    path.write_text(out.data[router_configmap.CONFIG_KEY])
    assert "r" in [r.name for r in parse_config(path.read_text()).routes]
    # The upstream comes back: normal rendering, Ready again.
    back = routeconfig.render_namespace([ir("r", "small", "big"), ir("other", "small")], upstreams,
                                        previous=out.data)
    assert back.routes["r"].ready and back.data == before.data


def test_the_last_good_config_is_found_through_the_config_map_the_route_names() -> None:
    before = routeconfig.render_config_maps([ir("r", "small", config_map="other-config")], [gu("small")])
    previous = {cm: out.data for cm, out in before.items()}
    outs = routeconfig.render_config_maps([ir("r", "small", config_map="other-config")], [], previous)
    assert routes_in(outs["other-config"]) == ["r"] and "keeps serving" in outs["other-config"].routes["r"].message
    # Another ConfigMap's rendering is not this route's.
    moved = routeconfig.render_config_maps([ir("r", "small")], [], previous)
    assert routes_in(moved["oculis-router-config"]) == [] and "left out" in moved["oculis-router-config"].routes[
        "r"].message
    # A deleted route leaves at once, last good config or not.
    going = ir("r", "small", config_map="other-config", deletionTimestamp="2026-12-01T00:00:00Z")
    assert routeconfig.render_config_maps([going], [], previous) == {}


def test_only_a_vanished_upstream_keeps_a_route_in_the_router_config() -> None:
    before = routeconfig.render_namespace([ir("r", "small")], [gu("small")]).data
    # An invalid spec, a name collision and an invalid upstream are refusals of the route itself.
    bad_spec = ir("r", "small")
    bad_spec["spec"]["tiers"][0]["match"] = {"complexityBelow": 7}
    invalid = routeconfig.render_namespace([bad_spec], [gu("small")], before)
    assert invalid.routes["r"].reason == "InvalidSpec" and routes_in(invalid) == []
    collision = routeconfig.render_namespace([ir("r", "small")], [gu("small"), gu("r")], before)
    assert collision.routes["r"].reason == "NameCollision" and routes_in(collision) == []
    # A route edited to name a missing upstream is broken by the edit: it leaves, never serving the
    # spec it no longer has.
    edited = routeconfig.render_namespace([ir("r", "missing")], [gu("small")], before)
    assert edited.routes["r"].reason == "UpstreamNotFound" and "left out" in edited.routes["r"].message
    assert routes_in(edited) == []
    # A tier over a vanished upstream and another over a broken one: the broken one counts.
    two = routeconfig.render_namespace([ir("r", "small", "compat")], [gu("small"), gu("compat", "openai")])
    broken = routeconfig.render_namespace([ir("r", "small", "compat")],
                                          [gu("compat", "openai-compatible")], two.data)
    assert routes_in(broken) == [] and "left out" in broken.routes["r"].message


def test_a_config_map_edited_by_hand_is_never_a_last_good_config() -> None:
    out = routeconfig.render_namespace([ir("r", "small")], [gu("small")])
    assert router_configmap.written_data(live(out)) == out.data
    edited = live(out)
    edited["data"][router_configmap.CONFIG_KEY] += "# hand edit\n"
    assert router_configmap.written_data(edited) is None and router_configmap.written_data(None) is None
    gone = routeconfig.render_namespace([ir("r", "small")], [], router_configmap.written_data(edited))
    assert routes_in(gone) == [] and "left out" in gone.routes["r"].message
