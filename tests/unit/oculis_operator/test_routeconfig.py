"""InferenceRoutes + GPUUpstreams -> router config, before anything is written."""

from __future__ import annotations

from typing import Any

import yaml

from oculis import parse_config
from oculis_operator import routeconfig, router_configmap


def gu(name: str, provider: str = "vllm", ready: bool = True, **spec: Any) -> dict[str, Any]:
    body = {"provider": provider, "model": f"model-{name}", **spec}
    if provider == "vllm":
        body["gpu"] = {"product": "H100-80GB", "count": 1}
    return {
        "metadata": {"name": name, "namespace": "ns", "generation": 2},
        "spec": body,
        "status": {
            "engineHash": f"h-{name}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                            "reason": "AllReplicasReady" if ready else "ChangeRefused"}],
        },
    }


def ir(name: str, *upstreams: str) -> dict[str, Any]:
    tiers = [{"name": f"t{i}", "match": {"complexityBelow": 0.5}, "upstream": u} for i, u in enumerate(upstreams)]
    tiers[-1]["match"] = {}
    return {"metadata": {"name": name, "namespace": "ns", "generation": 1}, "spec": {"tiers": tiers}}


def test_renders_valid_config_with_revisions_and_secret_env() -> None:
    out = routeconfig.render_namespace(
        [ir("adaptive", "small", "gpt")],
        [gu("small"), gu("gpt", "openai", apiKeySecretRef={"name": "s"}, pricing={"inputPerMtok": 2.5})],
    )
    cfg = parse_config(out.data[router_configmap.CONFIG_KEY])
    assert cfg.upstream("small").revision == "h-small"
    assert cfg.upstream("small").base_url == "http://small-vllm.ns.svc:8000/v1"
    assert cfg.upstream("gpt").api_key_env == "OCULIS_KEY_GPT" and cfg.upstream("gpt").pricing.input_per_mtok == 2.5
    assert yaml.safe_load(out.data[router_configmap.SECRETS_KEY]) == [
        {"env": "OCULIS_KEY_GPT", "secret": "s", "key": "api-key"}
    ]
    assert out.routes["adaptive"].ready and out.routes["adaptive"].tiers == "t0->small, t1->gpt"


def test_missing_and_unready_upstreams_are_reported() -> None:
    out = routeconfig.render_namespace([ir("a", "small"), ir("b", "small", "ghost")], [gu("small", ready=False)])
    assert out.routes["b"].reason == "UpstreamNotFound" and "ghost" in out.routes["b"].message
    assert out.routes["a"].reason == "UpstreamNotReady" and not out.routes["a"].ready
    assert out.routes["a"].message == "rendered, but not Ready yet: small (ChangeRefused)"
    assert [r.name for r in parse_config(out.data[router_configmap.CONFIG_KEY]).routes] == ["a"]


def test_timeouts_of_gpuupstreams_and_route_tiers_reach_the_router_config() -> None:
    from oculis_router.upstreams import Limits, limits

    route = ir("adaptive", "small", "gpt")
    route["spec"]["tiers"][1]["timeouts"] = {"firstByteSeconds": 600}  # a per-tier override
    out = routeconfig.render_namespace(
        [route], [gu("small", timeouts={"connectSeconds": 2, "idleSeconds": 15}),
                  gu("gpt", "openai", timeouts={"firstByteSeconds": 90})])
    cfg = parse_config(out.data[router_configmap.CONFIG_KEY])
    tiers = cfg.route("adaptive").tiers
    assert limits(cfg.upstream("small"), tiers[0].timeouts) == Limits(2.0, 120.0, 15.0)
    assert limits(cfg.upstream("gpt"), tiers[1].timeouts) == Limits(10.0, 600.0, 60.0)
    assert limits(cfg.upstream("gpt")) == Limits(10.0, 90.0, 60.0)
