"""Token usage as upstreams report it, and what it cost: pure functions, no I/O."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oculis import Pricing


@dataclass(frozen=True, slots=True)
class Usage:
    prompt: int
    completion: int
    cached: int  # prompt tokens served from the provider's prompt cache
    cache_written: int  # prompt tokens written to it (Anthropic's cache_creation_input_tokens)

    @classmethod
    def parse(cls, usage: Any) -> Usage | None:
        """OpenAI-shaped usage (Anthropic's is mapped into it by its provider module). It comes from
        the upstream, so it is data, not trusted: a count that is not a non-negative number (a string,
        a negative, a list) counts 0 rather than failing the answer it came with."""
        if not usage or not isinstance(usage, dict):
            return None
        details = usage.get("prompt_tokens_details")
        return cls(prompt=_count(usage.get("prompt_tokens")), completion=_count(usage.get("completion_tokens")),
                   cached=_count(details.get("cached_tokens") if isinstance(details, dict) else None),
                   cache_written=_count(usage.get("cache_creation_input_tokens")))


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return 0
    return int(value)


def cost_dollars(pricing: Pricing, u: Usage) -> float:
    """Cached and cache-write tokens at their own prices when given, else at the input price."""
    base = pricing.input_per_mtok
    cached_price = base if pricing.cached_input_per_mtok is None else pricing.cached_input_per_mtok
    write_price = base if pricing.cache_write_per_mtok is None else pricing.cache_write_per_mtok
    uncached = max(u.prompt - u.cached - u.cache_written, 0)
    return (uncached * base + u.completion * pricing.output_per_mtok
            + u.cached * cached_price + u.cache_written * write_price) / 1e6
