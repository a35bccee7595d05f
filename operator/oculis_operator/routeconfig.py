"""InferenceRoutes + GPUUpstreams of one namespace -> the router's `oculis-config.yaml`. Pure.

Only routes whose every tier names an existing GPUUpstream are rendered (the others report why in
their status), and the result is validated with the router's own schema before anyone writes it, so
the router never receives a config it would reject. An upstream's `revision` is its engine hash, so
the router's response cache never serves an answer from a replaced model. External providers'
keys stay in their Secrets: the config names an environment variable per upstream, and
`secret-env.json` maps each variable to its Secret reference for the router Deployment.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from oculis.base import format_errors
from oculis.inferenceroute import InferenceRouteSpec
from oculis.router import RouterConfig
from oculis_operator import render
from oculis_operator.conditions import condition

CONFIG_KEY, SECRETS_KEY = "oculis-config.yaml", "secret-env.json"


@dataclass
class RouteVerdict:
    ready: bool
    reason: str
    message: str
    tiers: str = ""


@dataclass
class Rendered:
    data: dict[str, str]  # ConfigMap data
    digest: str
    routes: dict[str, RouteVerdict] = field(default_factory=dict)


def key_env(name: str) -> str:
    return "OCULIS_KEY_" + name.upper().replace("-", "_")


def upstream_entry(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status") or {}
    name = meta["name"]
    entry: dict[str, Any] = {"name": name, "provider": spec["provider"], "model": spec.get("model")}
    if spec.get("pricing"):
        entry["pricing"] = {
            k: v
            for k, v in {
                "input_per_mtok": spec["pricing"].get("inputPerMtok"),
                "output_per_mtok": spec["pricing"].get("outputPerMtok"),
                "cached_input_per_mtok": spec["pricing"].get("cachedInputPerMtok"),
                "cache_write_per_mtok": spec["pricing"].get("cacheWritePerMtok"),
            }.items()
            if v is not None
        }
    secret = None
    if spec["provider"] == "vllm":
        entry["base_url"] = render.endpoint(name, meta["namespace"])
        entry["revision"] = status.get("engineHash") or "pending"
    else:
        if spec.get("baseURL"):
            entry["base_url"] = spec["baseURL"]
        ref = spec.get("apiKeySecretRef")
        if ref:
            entry["api_key_env"] = key_env(name)
            secret = {"env": key_env(name), "secret": ref["name"], "key": ref.get("key", "api-key")}
        pc = spec.get("promptCache")
        if pc:
            entry["prompt_cache"] = {
                k: v
                for k, v in {
                    "enabled": True,
                    "min_prefix_tokens": pc.get("minPrefixTokens"),
                    "breakpoints": pc.get("breakpoints"),
                    "ttl": pc.get("ttl"),
                }.items()
                if v is not None
            }
        entry["revision"] = str(meta.get("generation", 1))
    return entry, secret


def ready(obj: dict[str, Any]) -> bool:
    return condition(obj.get("status"), "Ready").get("status") == "True"


def not_ready_because(obj: dict[str, Any]) -> str:
    """`name (Reason)`: why an upstream is not Ready, as its own Ready condition says."""
    return f"{obj['metadata']['name']} ({condition(obj.get('status'), 'Ready').get('reason', 'not reconciled yet')})"


def render_namespace(routes: list[dict[str, Any]], upstreams: list[dict[str, Any]]) -> Rendered:
    by_name = {u["metadata"]["name"]: u for u in upstreams}
    verdicts: dict[str, RouteVerdict] = {}
    rendered_routes: list[dict[str, Any]] = []
    used: set[str] = set()
    for obj in sorted(routes, key=lambda r: r["metadata"]["name"]):
        name = obj["metadata"]["name"]
        try:
            spec = InferenceRouteSpec.model_validate(obj.get("spec", {}))
        except ValidationError as exc:
            verdicts[name] = RouteVerdict(False, "InvalidSpec", format_errors(exc, "spec").replace("\n", "; "))
            continue
        tiers = ", ".join(f"{t.name}->{t.upstream}" for t in spec.tiers)
        missing = [t.upstream for t in spec.tiers if t.upstream not in by_name]
        if missing:
            verdicts[name] = RouteVerdict(
                False,
                "UpstreamNotFound",
                f"no GPUUpstream named {', '.join(missing)} in "
                "this namespace; the route is left out of the router config",
                tiers,
            )
            continue
        not_ready = [not_ready_because(by_name[u]) for u in dict.fromkeys(t.upstream for t in spec.tiers)
                     if not ready(by_name[u])]
        body = spec.model_dump(exclude={"config_map"}, mode="json")
        rendered_routes.append({"name": name, **body})
        used.update(t.upstream for t in spec.tiers)
        verdicts[name] = (
            RouteVerdict(False, "UpstreamNotReady", f"rendered, but not Ready yet: {', '.join(not_ready)}", tiers)
            if not_ready
            else RouteVerdict(True, "Rendered", "in the router config", tiers)
        )
    entries, secrets = [], []
    for uname in sorted(used):
        entry, secret = upstream_entry(by_name[uname])
        entries.append(entry)
        if secret:
            secrets.append(secret)
    data: dict[str, str] = {}
    if entries:
        doc = {"oculis": {"upstreams": entries, "routes": rendered_routes}}
        try:
            RouterConfig.model_validate(doc["oculis"])  # exactly what the router will accept
        except ValidationError as exc:
            for r in rendered_routes:
                verdicts[r["name"]] = RouteVerdict(
                    False, "InvalidRouterConfig", format_errors(exc), verdicts[r["name"]].tiers
                )
            entries = []
        else:
            data = {CONFIG_KEY: yaml.safe_dump(doc, sort_keys=False), SECRETS_KEY: json.dumps(secrets, indent=1)}
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    return Rendered(data, digest, verdicts)
