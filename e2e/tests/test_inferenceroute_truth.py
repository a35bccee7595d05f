"""The router ConfigMap always equals the current routes: on the real API server, with the real
garbage collector, the operator's ConfigMaps hold exactly the routes that name them and can be
served (a route whose upstream was deleted keeping its last good config, Degraded), are owned by those
routes, revert hand edits, and go when no route names them."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from e2e_support import eventually
from kubernetes import client

from oculis import parse_config

G, V = "oculis.dev", "v1alpha1"
DEFAULT_CM = "oculis-router-config"


class Routes:
    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.ns = ns
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def upstream(self, name: str, **spec: Any) -> None:
        body = {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": name},
                "spec": {"provider": "openai", "model": f"model-{name}", **spec}}
        self.custom.create_namespaced_custom_object(G, V, self.ns, "gpuupstreams", body)

    def route(self, name: str, *upstreams: str, config_map: str | None = None) -> None:
        self.custom.create_namespaced_custom_object(G, V, self.ns, "inferenceroutes", route_body(
            name, *upstreams, config_map=config_map))

    def patch_route(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(G, V, self.ns, "inferenceroutes", name, {"spec": spec})

    def delete_route(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(G, V, self.ns, "inferenceroutes", name)

    def ready(self, name: str) -> tuple[str, str]:
        obj = self.custom.get_namespaced_custom_object(G, V, self.ns, "inferenceroutes", name)
        c = next((x for x in (obj.get("status") or {}).get("conditions", []) if x["type"] == "Ready"), {})
        return c.get("status", ""), c.get("reason", "")

    def cm(self, name: str = DEFAULT_CM) -> client.V1ConfigMap | None:
        try:
            return self.core.read_namespaced_config_map(name, self.ns)
        except client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def routes_in(self, name: str = DEFAULT_CM) -> list[str] | None:
        """The routes the router would serve from this ConfigMap (None: there is no ConfigMap)."""
        cm = self.cm(name)
        if cm is None:
            return None
        return [r.name for r in parse_config(cm.data["oculis-config.yaml"], name).routes]


def route_body(name: str, *upstreams: str, config_map: str | None = None) -> dict[str, Any]:
    tiers = [{"name": f"t{i}", "match": {"complexityBelow": 0.5}, "upstream": u} for i, u in enumerate(upstreams)]
    tiers[-1]["match"] = {}
    spec: dict[str, Any] = {"tiers": tiers, **({"configMap": config_map} if config_map else {})}
    return {"apiVersion": f"{G}/{V}", "kind": "InferenceRoute", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def r(api: client.ApiClient, namespace: str, operator: Any) -> Routes:
    return Routes(api, namespace)


def test_a_broken_then_deleted_last_route_leaves_the_config_map(r: Routes) -> None:
    r.upstream("gpt")
    r.route("solo", "gpt")
    eventually(lambda: r.routes_in() == ["solo"], what="solo rendered")
    cm = r.cm()
    assert cm is not None
    assert [(o.kind, o.name) for o in cm.metadata.owner_references or []] == [("InferenceRoute", "solo")]

    # Broken: the ConfigMap holds the empty config the router answers 404 from, as the status says.
    r.patch_route("solo", {"tiers": [{"name": "all", "match": {}, "upstream": "missing"}]})
    eventually(lambda: r.ready("solo") == ("False", "UpstreamNotFound"), what="solo not ready")
    eventually(lambda: r.routes_in() == [], what="solo left out of the ConfigMap")
    assert yaml.safe_load(r.cm().data["oculis-config.yaml"]) == {"oculis": {"upstreams": [], "routes": []}}

    # Deleted: the ConfigMap goes with its last owner.
    r.delete_route("solo")
    eventually(lambda: r.cm() is None, what="ConfigMap deleted with its last route")


def test_the_garbage_collector_removes_the_config_map_with_its_last_route_while_the_operator_is_down(
        r: Routes, operator: Any) -> None:
    r.upstream("gpt")
    r.route("solo", "gpt")
    eventually(lambda: r.routes_in() == ["solo"], what="solo rendered")
    operator.stop()
    try:
        r.delete_route("solo")
        eventually(lambda: r.cm() is None, what="ConfigMap collected by its owner reference")
    finally:
        operator.start()
        operator.wait_ready(operator.webhook_registered)


def test_each_config_map_holds_only_the_routes_that_name_it_and_follows_a_move(r: Routes) -> None:
    r.upstream("gpt")
    r.route("a", "gpt")
    r.route("b", "gpt", config_map="other-config")
    eventually(lambda: r.routes_in() == ["a"] and r.routes_in("other-config") == ["b"], what="one route each")
    other = r.cm("other-config")
    assert other is not None and [o.name for o in other.metadata.owner_references] == ["b"]

    r.patch_route("a", {"configMap": "other-config"})  # the old ConfigMap must drop it, and go
    eventually(lambda: r.routes_in("other-config") == ["a", "b"], what="a moved")
    eventually(lambda: r.cm() is None, what="the ConfigMap no route names is deleted")
    st = r.custom.get_namespaced_custom_object(G, V, r.ns, "inferenceroutes", "a")["status"]
    assert st["configMap"] == "other-config"


def test_a_hand_edited_or_deleted_config_map_is_rewritten_from_the_routes(r: Routes) -> None:
    r.upstream("gpt")
    r.route("a", "gpt")
    eventually(lambda: r.routes_in() == ["a"], what="rendered")
    good = r.cm()
    assert good is not None
    evil = yaml.safe_load(good.data["oculis-config.yaml"])
    evil["oculis"]["routes"].append({"name": "evil", "tiers": [{"name": "x", "match": {}, "upstream": "gpt"}]})
    r.core.patch_namespaced_config_map(DEFAULT_CM, r.ns, {"data": {"oculis-config.yaml": yaml.safe_dump(evil)}})
    eventually(lambda: r.routes_in() == ["a"], what="hand edit reverted")
    events = r.core.list_namespaced_event(r.ns, field_selector="involvedObject.name=a").items
    assert any(e.reason == "ConfigMapReverted" and "edited by hand" in e.message for e in events)

    r.core.patch_namespaced_config_map(DEFAULT_CM, r.ns, {"metadata": {"ownerReferences": None}})
    eventually(lambda: [o.name for o in (r.cm().metadata.owner_references or [])] == ["a"],
               what="owner references restored")
    r.core.delete_namespaced_config_map(DEFAULT_CM, r.ns)
    eventually(lambda: r.routes_in() == ["a"], what="deleted ConfigMap recreated")


def test_unrelated_routes_stay_ready_when_one_breaks_or_collides(r: Routes) -> None:
    r.upstream("gpt")
    r.upstream("llama-8b")
    r.route("r", "gpt")
    r.route("llama-8b", "gpt")  # shares the upstream's name: a request for it would reach the upstream
    eventually(lambda: r.ready("llama-8b") == ("False", "NameCollision"), what="collision reported")
    eventually(lambda: r.ready("r") == ("True", "Rendered"), what="r Ready")
    assert r.routes_in() == ["r"]

    r.route("uses-gone", "gone")
    eventually(lambda: r.ready("uses-gone") == ("False", "UpstreamNotFound"), what="broken route reported")
    assert r.ready("r") == ("True", "Rendered") and r.routes_in() == ["r"]


def test_an_upstream_deleted_under_a_live_route_keeps_its_last_good_config(r: Routes) -> None:
    r.upstream("gpt")
    r.upstream("claude", provider="anthropic")
    r.route("keep", "claude")
    r.route("lose", "claude", "gpt")
    eventually(lambda: r.routes_in() == ["keep", "lose"], what="both rendered")
    r.custom.delete_namespaced_custom_object(G, V, r.ns, "gpuupstreams", "gpt")
    # The router keeps serving the route (its claude tier answers, the gpt tier fails over), and its
    # status says so: Degraded, naming the vanished upstream.
    eventually(lambda: r.ready("lose") == ("False", "UpstreamNotFound"), what="the route names the deleted upstream")
    obj = r.custom.get_namespaced_custom_object(G, V, r.ns, "inferenceroutes", "lose")
    degraded = next(c for c in obj["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["message"] == (
        "no GPUUpstream named gpt in this namespace; the router keeps serving this route's last good config")
    assert r.ready("keep")[0] == "True" and r.routes_in() == ["keep", "lose"]
    cfg = parse_config(r.cm().data["oculis-config.yaml"])
    assert [u.name for u in cfg.upstreams] == ["claude", "gpt"]
    # The upstream comes back: normal rendering, Ready again.
    r.upstream("gpt")
    eventually(lambda: r.ready("lose")[0] == "True", what="the route Ready over the recreated upstream")
    # With the upstream gone again, deleting the route takes it (and the upstream entry) out.
    r.custom.delete_namespaced_custom_object(G, V, r.ns, "gpuupstreams", "gpt")
    eventually(lambda: r.ready("lose") == ("False", "UpstreamNotFound"), what="degraded again")
    r.delete_route("lose")
    eventually(lambda: r.routes_in() == ["keep"], what="the deleted route left the config")
    assert [u.name for u in parse_config(r.cm().data["oculis-config.yaml"]).upstreams] == ["claude"]


def test_a_route_over_a_missing_upstream_that_never_rendered_is_left_out(r: Routes) -> None:
    r.upstream("claude", provider="anthropic")
    r.route("keep", "claude")
    r.route("never", "claude", "ghost")
    eventually(lambda: r.ready("never") == ("False", "UpstreamNotFound"), what="the route names the missing upstream")
    assert r.routes_in() == ["keep"]


@pytest.mark.parametrize(("kind", "body", "expected"), [
    ("inferenceroutes", route_body("x", "odd/8b-digit"), "upstreams must be in the route's namespace"),
    ("inferenceroutes", route_body("x", "8b-digit"), "spec.tiers[0].upstream in body should match"),
    ("gpuupstreams", {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "compat"},
                      "spec": {"provider": "openai-compatible", "model": "m"}},
     "spec.baseURL is required when provider is openai-compatible"),
])
def test_unservable_references_are_refused_at_apply(api: client.ApiClient, crds: None, namespace: str, kind: str,
                                                    body: dict[str, Any], expected: str) -> None:
    with pytest.raises(client.ApiException) as err:
        client.CustomObjectsApi(api).create_namespaced_custom_object(G, V, namespace, kind, body, dry_run="All")
    assert err.value.status == 422
    assert expected in json.loads(err.value.body)["message"]
