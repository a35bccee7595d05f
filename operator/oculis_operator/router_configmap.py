"""The router ConfigMaps as objects: their keys, labels and owners (the routes that name one), the
hash annotation that tells the operator's last write from a hand edit, and a route's last good
block in that write. Pure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from oculis.inferenceroute import DEFAULT_CONFIG_MAP
from oculis.router import Route
from oculis_operator.route_upstreams import route_upstreams

CONFIG_KEY, SECRETS_KEY = "oculis-config.yaml", "secret-env.json"
HASH_ANNOTATION = "oculis.dev/config-hash"  # digest of the data the operator last wrote
LABELS = {"app.kubernetes.io/managed-by": "oculis", "app.kubernetes.io/component": "router-config"}
SELECTOR = ",".join(f"{k}={v}" for k, v in LABELS.items())
ROUTE_API_VERSION, ROUTE_KIND = "oculis.dev/v1alpha1", "InferenceRoute"


def config_map_of(route: dict[str, Any]) -> str:
    return (route.get("spec") or {}).get("configMap") or DEFAULT_CONFIG_MAP


def data_digest(data: dict[str, str] | None) -> str:
    return hashlib.sha256(json.dumps(data or {}, sort_keys=True).encode()).hexdigest()[:16]


def owner_references(routes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Not controller references: several routes own one ConfigMap, and it goes with the last."""
    return [{"apiVersion": ROUTE_API_VERSION, "kind": ROUTE_KIND, "name": r["metadata"]["name"],
             "uid": r["metadata"]["uid"]}
            for r in sorted(routes, key=lambda r: r["metadata"]["name"]) if r["metadata"].get("uid")]


def written_data(current: dict[str, Any] | None) -> dict[str, str] | None:
    """The live ConfigMap's data if it is what the operator last wrote (its hash annotation matches),
    else None: a hand edit must never be carried over as a route's last good config."""
    if current is None:
        return None
    data = current.get("data") or {}
    written = ((current.get("metadata") or {}).get("annotations") or {}).get(HASH_ANNOTATION)
    return dict(data) if written == data_digest(data) else None


@dataclass
class LastGood:
    """A route's block from the previous rendering, with the upstream entries and Secret env it named."""

    route: dict[str, Any]
    upstreams: dict[str, dict[str, Any]]
    secrets: dict[str, dict[str, Any]]  # by env variable name


def last_good(previous: Mapping[str, str] | None, name: str) -> LastGood | None:
    """Route `name` as the previous rendering (`previous`: that ConfigMap's data) served it; None when
    it held no such route or cannot be read."""
    if not previous:
        return None
    try:
        doc = (yaml.safe_load(previous.get(CONFIG_KEY) or "") or {}).get("oculis") or {}
        block = next((r for r in doc.get("routes") or [] if r.get("name") == name), None)
        if block is None:
            return None
        by_name = {u["name"]: u for u in doc.get("upstreams") or []}
        names = route_upstreams(Route.model_validate(block))
        if any(u not in by_name for u in names):
            return None
        secrets = {s["env"]: s for s in json.loads(previous.get(SECRETS_KEY) or "[]")}
    except (yaml.YAMLError, json.JSONDecodeError, ValidationError, AttributeError, KeyError, TypeError):
        return None
    return LastGood(block, {u: by_name[u] for u in names}, secrets)
