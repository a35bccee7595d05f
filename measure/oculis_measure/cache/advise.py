"""`oculis cache advise`: whether prompt caching pays for observed traffic. Pure functions, no I/O.

A cached prefix is written once (at w times the uncached input price) and then read h times (at r
times it). Against h + 1 uncached sends, caching costs (w + h*r) / (1 + h) of the price, so it pays
when w + h*r < 1 + h, i.e. h > (w - 1) / (1 - r): one hit at Anthropic's 5-minute price (w 1.25,
r 0.10), two at its 1-hour price (w 2.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from oculis import Pricing


@dataclass(frozen=True)
class Multipliers:
    write: float  # w: cache-write price / uncached input price
    read: float  # r: cache-read price / uncached input price
    source: str  # where they came from (flags, the upstream's pricing, a default)


def break_even_hits(w: float, r: float) -> float | None:
    """(w - 1) / (1 - r): hits per write above which caching is cheaper; None when reads are not
    discounted (r >= 1: caching never pays); 0 when writes cost no premium (every hit pays)."""
    if r >= 1:
        return None
    return max((w - 1) / (1 - r), 0.0)


def min_hits(break_even: float | None) -> int | None:
    """The smallest whole number of hits per write strictly above the break-even."""
    if break_even is None:
        return None
    return math.floor(break_even) + 1


def multipliers_from_pricing(p: Pricing, upstream: str) -> Multipliers:
    """w and r from the upstream's per-token prices. A price left unset is billed as uncached input
    (cost_dollars does the same), i.e. a multiplier of 1."""
    if p.input_per_mtok <= 0:
        raise ValueError(f"upstream {upstream}: pricing.input_per_mtok is 0, so cache multipliers are undefined; "
                         "set its pricing or pass --write-multiplier and --read-multiplier")
    w = 1.0 if p.cache_write_per_mtok is None else p.cache_write_per_mtok / p.input_per_mtok
    r = 1.0 if p.cached_input_per_mtok is None else p.cached_input_per_mtok / p.input_per_mtok
    return Multipliers(round(w, 6), round(r, 6), f"upstream {upstream}'s pricing")


def net_saving(cached_tokens: float, written_tokens: float, input_per_mtok: float, m: Multipliers) -> float:
    """Dollars prompt caching saved: the reads' discount (1 - r) off the input price, minus the premium
    (w - 1) paid on the writes. The one saving figure: `cost report` and `cache advise` both print it."""
    return (cached_tokens * (1 - m.read) - written_tokens * (m.write - 1)) * input_per_mtok / 1e6


def pricing_saving(p: Pricing, cached_tokens: float, written_tokens: float) -> float:
    """net_saving at an upstream's own prices ($0 for an upstream without an input price)."""
    if p.input_per_mtok <= 0:
        return 0.0
    return net_saving(cached_tokens, written_tokens, p.input_per_mtok, multipliers_from_pricing(p, ""))


@dataclass(frozen=True)
class Observed:
    """Prompt-token counters of one upstream over the window (increase())."""

    prompt_tokens: float
    cached_tokens: float  # read from the provider's cache
    cache_write_tokens: float | None  # None: not counted by this router


def advise(upstream: str, m: Multipliers, obs: Observed | None, input_per_mtok: float) -> dict[str, Any]:
    """The advice as a JSON-ready dict: break-even, observed reuse, and a verdict with its reason."""
    be = break_even_hits(m.write, m.read)
    out: dict[str, Any] = {
        "upstream": upstream,
        "write_multiplier": m.write,
        "read_multiplier": m.read,
        "multipliers_from": m.source,
        "break_even_hits": None if be is None else round(be, 4),
        "min_hits": min_hits(be),
        "rule": "caching pays when hits per write h > (w - 1) / (1 - r)",
    }
    if be is None:
        out.update(verdict="does-not-pay", reason=f"reads cost {m.read:g}x the input price (no discount), so no "
                   "number of hits pays for a write")
        return out
    if obs is None or obs.prompt_tokens <= 0:
        out.update(cache_read_token_share=None, hits_per_write=None, verdict="no-traffic",
                   reason="no prompt tokens counted for this upstream in the window")
        return out
    share = obs.cached_tokens / obs.prompt_tokens
    out["cache_read_token_share"] = round(share, 4)
    out["prompt_tokens"] = int(obs.prompt_tokens)
    out["cached_tokens"] = int(obs.cached_tokens)
    if obs.cache_write_tokens:
        h = obs.cached_tokens / obs.cache_write_tokens
        out["hits_per_write"] = round(h, 3)
        out["hits_per_write_basis"] = "cache-read tokens / cache-write tokens"
    elif share < 1:
        # Without a write counter: a prefix read h times per write is at most h/(h+1) of the prompt
        # tokens, so the observed share gives a lower bound h >= s/(1-s).
        h = share / (1 - share)
        out["hits_per_write"] = round(h, 3)
        out["hits_per_write_basis"] = "lower bound s/(1-s) from the cache-read token share (no write counter)"
    else:
        h = math.inf
        out["hits_per_write"] = None
        out["hits_per_write_basis"] = "every prompt token was a cache read"
    writes = obs.cache_write_tokens or 0.0
    out["saving_dollars"] = round(net_saving(obs.cached_tokens, writes, input_per_mtok, m), 6)
    if h > be:
        out.update(verdict="pays", reason=f"observed {_h(h)} hits per write > break-even {be:.3f}")
    elif m.write <= 1 and share == 0:  # nothing read, but writes cost no premium: caching costs nothing here
        out.update(verdict="no-reuse", reason=f"no prompt token was read from the cache; writes cost {m.write:g}x "
                   "the input price (no premium), so caching costs nothing here: keep it, and stabilise the prompt "
                   "prefix (system prompt, tools first) so requests can reuse it")
    elif obs.cache_write_tokens or share == 0:
        out.update(verdict="does-not-pay", reason=f"observed {_h(h)} hits per write <= break-even {be:.3f}; "
                   "stabilise the prompt prefix (system prompt, tools first) or turn prompt caching off")
    else:
        out.update(verdict="undetermined", reason=f"at least {_h(h)} hits per write (no cache-write counter), "
                   f"break-even {be:.3f}; the upstream's cache-write tokens would settle it")
    return out


def _h(h: float) -> str:
    return "inf" if math.isinf(h) else f"{h:.3f}"


SELF_HOSTED = Multipliers(1.0, 0.0, "self-hosted vLLM prefix cache (no price premium; a hit skips its prefill)")


def self_hosted_multipliers(write: float | None, read: float | None) -> Multipliers:
    """A vLLM upstream's w and r: the flags given, the self-hosted defaults (w 1, r 0) for the others; never
    the pricing's (a self-hosted price has no cache terms, so r would read 1: QA3 Part 2 #6)."""
    if write is None and read is None:
        return SELF_HOSTED
    flags = " and ".join(f for f, v in (("--write-multiplier", write), ("--read-multiplier", read)) if v is not None)
    return Multipliers(SELF_HOSTED.write if write is None else write, SELF_HOSTED.read if read is None else read,
                       f"{flags}; otherwise the self-hosted vLLM prefix cache's (w 1, r 0)")


def advise_self_hosted(upstream: str, hit_tokens: float | None, query_tokens: float | None,
                       m: Multipliers = SELF_HOSTED, input_per_mtok: float = 0.0) -> dict[str, Any]:
    """A vLLM upstream: its prefix cache costs no price premium (w 1) and a hit's prefill is nearly
    free (r about 0), so any reuse pays; what matters is the hit-token share the engines report
    (vllm:prefix_cache_hits / vllm:prefix_cache_queries, in tokens). Multipliers other than those (flags)
    are judged by `advise` on the same engine counters: the data never changes with the flags."""
    if m != SELF_HOSTED:
        judged = advise(upstream, m, Observed(query_tokens or 0.0, hit_tokens or 0.0, None), input_per_mtok)
        if query_tokens and hit_tokens is not None:
            judged.update(prefix_hit_token_share=round(hit_tokens / query_tokens, 4),
                          prefix_hit_tokens=int(hit_tokens), prefix_query_tokens=int(query_tokens),
                          observed_from="the engines' vllm:prefix_cache_hits / vllm:prefix_cache_queries")
        return judged
    be = break_even_hits(1.0, 0.0)
    out: dict[str, Any] = {
        "upstream": upstream, "write_multiplier": 1.0, "read_multiplier": 0.0,
        "multipliers_from": "self-hosted vLLM prefix cache (no price premium; a hit skips its prefill)",
        "break_even_hits": be, "min_hits": min_hits(be),
        "rule": "caching pays when hits per write h > (w - 1) / (1 - r)",
    }
    if not query_tokens or hit_tokens is None:
        out.update(prefix_hit_token_share=None, verdict="no-traffic",
                   reason="no vllm:prefix_cache_queries counted for this upstream's engines in the window (are "
                          "the engines scraped, with prefix caching on?)")
        return out
    share = hit_tokens / query_tokens
    out.update(prefix_hit_token_share=round(share, 4), prefix_hit_tokens=int(hit_tokens),
               prefix_query_tokens=int(query_tokens))
    if share > 0:
        out.update(verdict="pays", reason=f"{share:.1%} of prompt tokens were prefix-cache hits: keep prefix "
                   "caching on, and keep shared prefixes (system prompt, tools) first and byte-identical")
    else:
        out.update(verdict="no-reuse", reason="no prompt token hit the prefix cache: the prompts share no prefix "
                   "(put the stable part first), or prefix caching is off")
    return out


# Anthropic's cache-write multipliers by TTL (platform.claude.com pricing): 5 minutes 1.25, 1 hour 2.0.
TTL_WRITE_MULTIPLIERS = {"5m": 1.25, "1h": 2.0}


def recommend_ttl(read: float, hits_per_write: float | None, exact: bool = True) -> dict[str, Any]:
    """For a provider with a choice of cache lifetimes: which TTL the observed hits per write pay for.
    Both break-evens use the same read multiplier; the 1-hour write costs more, so it needs more hits
    (it keeps a prefix across gaps longer than 5 minutes, which these counters cannot see). `exact`:
    hits_per_write was measured (cache-write tokens counted), not a lower bound."""
    bes = {ttl: break_even_hits(w, read) for ttl, w in TTL_WRITE_MULTIPLIERS.items()}
    out: dict[str, Any] = {"break_even_by_ttl": {k: None if v is None else round(v, 4) for k, v in bes.items()}}
    if hits_per_write is None:
        out["recommended_ttl"] = None
        return out
    paying = [ttl for ttl, be in bes.items() if be is not None and hits_per_write > be]
    # A lower bound (no write counter) can show that a TTL pays, never that none does.
    out["recommended_ttl"] = ("1h" if "1h" in paying else "5m" if "5m" in paying else
                              "none" if exact else "undetermined")
    return out
