"""Upstream wire formats: OpenAI-compatible (vLLM, OpenAI, others) and Anthropic's Messages API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oculis import Upstream
from oculis_router.errors import APIError
from oculis_router.providers import anthropic

# Upstream response headers the client gets too: the provider's request id (for support tickets and
# log correlation) and its rate-limit state (so a client can pace itself as the SDKs do).
RELAYED_NAMES = ("x-request-id", "request-id")
RELAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


def relayed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()
            if k.lower() in RELAYED_NAMES or k.lower().startswith(RELAYED_PREFIXES)}


def refusal(up: Upstream, endpoint: str, body: dict[str, Any]) -> APIError | None:
    """The 400 `up` would answer this request with, before any call: OpenAI-compatible upstreams take
    every field (None); an Anthropic one refuses what it cannot translate."""
    return anthropic.refusal(up, endpoint, body) if up.provider == "anthropic" else None
