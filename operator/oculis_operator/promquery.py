"""Instant PromQL queries against a Prometheus HTTP API for the operator's checks of running engines
that need live figures (observed KV blocks, canary analysis, speculation acceptance, autoscaling,
classifier drift). Standard library only: the operator image carries no HTTP client of the CLI's
bench extra. Every failure reads as "no samples", which callers never count as a pass."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any


def prometheus_result(url: str, query: str, timeout: float = 2.0) -> list[dict[str, Any]] | None:
    """The instant vector a PromQL query returns from a Prometheus HTTP API; None when the URL is unset,
    Prometheus unreachable or the answer malformed (callers treat that as no samples, never as a pass)."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}",
                                    timeout=timeout) as resp:
            body = json.load(resp)
        result: list[dict[str, Any]] = body["data"]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if isinstance(result, list) else None


def prometheus_value(url: str, query: str, timeout: float = 2.0) -> float | None:
    """The first sample's value of a query (a sum or a quantile), None when there is none or it is NaN."""
    result = prometheus_result(url, query, timeout)
    try:
        value = float(result[0]["value"][1]) if result else None
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if value is None or value != value else value


def prometheus_kv_blocks(url: str, namespace: str, name: str, timeout: float = 2.0) -> int | None:
    """The smallest num_gpu_blocks the upstream's engine pods (<name>-vllm-...) report through
    vllm:cache_config_info, from a Prometheus HTTP API; None when unset, unreachable or not scraped yet
    (the plan is then simply not compared)."""
    # The name unescaped: a DNS-1035 label has no regex metacharacter but '-', and re.escape's `\-` is an
    # invalid escape in a PromQL string (the query was refused for every hyphenated upstream name).
    query = f'vllm:cache_config_info{{namespace="{namespace}",pod=~"{name}-vllm-.+"}}'
    result = prometheus_result(url, query, timeout)
    try:
        blocks = [int(r["metric"]["num_gpu_blocks"]) for r in result or []
                  if str(r.get("metric", {}).get("num_gpu_blocks", "")).isdigit()]
    except (KeyError, TypeError, AttributeError):
        return None
    return min(blocks) if blocks else None


def kv_events_silent_query(namespace: str, name: str) -> str:
    """The router replicas' count of `name`'s replicas they hear no KV events from (the worst router's);
    a router scraped without a namespace label (outside the cluster) counts too, as for its demand."""
    return f'max(oculis_kv_events_silent_replicas{{namespace=~"{namespace}|",upstream="{name}"}})'
