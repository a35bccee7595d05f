"""Upstream wire formats: OpenAI-compatible (vLLM, OpenAI, others) and Anthropic's Messages API."""

from __future__ import annotations

from collections.abc import Mapping

# Upstream response headers the client gets too: the provider's request id (for support tickets and
# log correlation) and its rate-limit state (so a client can pace itself as the SDKs do).
RELAYED_NAMES = ("x-request-id", "request-id")
RELAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


def relayed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()
            if k.lower() in RELAYED_NAMES or k.lower().startswith(RELAYED_PREFIXES)}
