"""Token usage as upstreams report it, and what it cost: pure functions, no I/O."""

from __future__ import annotations

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
    def parse(cls, usage: dict[str, Any] | None) -> Usage | None:
        """OpenAI-shaped usage (Anthropic's is mapped into it by its provider module)."""
        if not usage:
            return None
        return cls(prompt=int(usage.get("prompt_tokens") or 0), completion=int(usage.get("completion_tokens") or 0),
                   cached=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                   cache_written=int(usage.get("cache_creation_input_tokens") or 0))


def cost_dollars(pricing: Pricing, u: Usage) -> float:
    """Cached and cache-write tokens at their own prices when given, else at the input price."""
    base = pricing.input_per_mtok
    cached_price = base if pricing.cached_input_per_mtok is None else pricing.cached_input_per_mtok
    write_price = base if pricing.cache_write_per_mtok is None else pricing.cache_write_per_mtok
    uncached = max(u.prompt - u.cached - u.cache_written, 0)
    return (uncached * base + u.completion * pricing.output_per_mtok
            + u.cached * cached_price + u.cache_written * write_price) / 1e6
