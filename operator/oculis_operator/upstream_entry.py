"""A GPUUpstream as an entry of the router's config: its base URL (the Service, or the provider's),
the stable alias it serves, revision, picker and tokenizer, adapters, canary share, cold state, and its
API key: for a self-hosted engine the file of its key in the router's engine-keys directory, for an
external provider the environment variable its key comes in. Pure.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from oculis.rollout import Canary
from oculis_operator import render
from oculis_operator.route_upstreams import SCALED_TO_ZERO, upstream_state


def key_env(name: str) -> str:
    return "OCULIS_KEY_" + name.upper().replace("-", "_")


def _given(src: dict[str, Any], **keys: str) -> dict[str, Any]:
    """The router config's snake_case keys for the CRD's camelCase fields that are set."""
    return {ours: src[theirs] for ours, theirs in keys.items() if src.get(theirs) is not None}


def upstream_entry(obj: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    meta, spec, status = obj["metadata"], obj.get("spec", {}), obj.get("status") or {}
    name = meta["name"]
    # A self-hosted upstream is asked for the stable alias its every replica serves (status.servedModel,
    # its own name), so a spec.model change keeps answering while old and new pods overlap.
    entry: dict[str, Any] = {"name": name, "provider": spec["provider"],
                             "model": (spec["provider"] == "vllm" and status.get("servedModel")) or spec.get("model")}
    if spec.get("pricing"):
        entry["pricing"] = _given(spec["pricing"], input_per_mtok="inputPerMtok", output_per_mtok="outputPerMtok",
                                  cached_input_per_mtok="cachedInputPerMtok",
                                  cache_write_per_mtok="cacheWritePerMtok")
    if spec.get("timeouts"):
        entry["timeouts"] = _given(spec["timeouts"], connect_seconds="connectSeconds",
                                   first_byte_seconds="firstByteSeconds", idle_seconds="idleSeconds")
    secret = None
    if spec["provider"] == "vllm":
        entry["base_url"] = render.endpoint(name, meta["namespace"])
        entry["revision"] = status.get("engineHash") or "pending"
        if (spec.get("access") or {}).get("apiKey", True) is not False:
            # The engine's key, a file of the Secret oculis-engine-keys the chart mounts in the router at
            # ENGINE_KEYS_DIR (engine_access): relative, so `oculis serve` outside a pod can point elsewhere.
            entry["api_key_file"] = name
        routing = spec.get("routing") or {}
        if picker := routing.get("picker"):
            entry["picker"] = picker
        # A path inside the router pod: not checked here (the operator cannot see the router's files); a
        # missing one is refused by the router's reload, which keeps serving its last good config.
        if tokenizer := routing.get("tokenizer"):
            entry["tokenizer"] = tokenizer
        if (spec.get("engine") or {}).get("schedulerPolicy") == "priority":  # vLLM takes `priority` then
            entry["priority_scheduling"] = True
        if adapters := spec.get("adapters"):  # a tier naming another adapter is refused (InvalidRouterConfig)
            entry["adapters"] = [a["name"] for a in adapters]
        if (share := canary_share(obj)) is not None:
            entry["canary"] = {"base_url": render.canary_endpoint(name, meta["namespace"]), "percent": share}
        # The router must know, to apply the route's coldStart instead of a doomed connection attempt:
        # scaled to zero, or autoscaled and waking (replicas asked for, none ready yet).
        waking = bool(spec.get("autoscaling")) and not (status.get("readyReplicas") or 0)
        if upstream_state(obj) == SCALED_TO_ZERO or waking:
            entry["scaled_to_zero"] = True
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


def canary_share(obj: dict[str, Any]) -> int | None:
    """spec.rollout.canary.trafficPercent while this upstream's canary is analysed with its replicas up
    (status.canary of the current generation and desired engine hash, phase Analyzing, startedAt set:
    the reconcile sets it once the canary Deployment is complete); else None. A canary that is waiting
    for GPUs, starting, promoted, rolled back or left over from an earlier spec takes no traffic."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    c = status.get("canary") or {}
    rollout = spec.get("rollout") or {}
    if (rollout.get("strategy") != "Canary" or c.get("phase") != "Analyzing" or not c.get("startedAt")
            or c.get("generation") != status.get("observedGeneration")
            or c.get("engineHash") != status.get("desiredEngineHash")):
        return None
    try:
        return Canary.model_validate(rollout.get("canary") or {}).traffic_percent
    except ValidationError:
        return None  # the upstream's own status says its spec is invalid
