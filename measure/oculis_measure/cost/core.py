"""Cost attribution from the router's counters over a window: pure functions, no I/O.

The router counts requests by (route, tier, upstream, outcome) but tokens and dollars by upstream
only (runtime/oculis_router/metrics.py). A route/tier's share of an upstream's tokens and dollars is
therefore its share of the requests that reached that upstream (outcomes other than cache_hit and
the router's own refusals). That is exact when an upstream serves one route and tier, and an
estimate weighted by request count when several share it; the report says so.

Dollars come from `oculis_cost_dollars_total` (priced by the router with the same
`usage.cost_dollars`), so the totals agree with the metric; re-pricing (baselines, cache savings)
goes through `usage.cost_dollars` too: one cost formula in one place.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from oculis import Pricing
from oculis_router.usage import Usage, cost_dollars

GROUP_KEYS = ("route", "tier", "upstream")
ESTIMATE_NOTE = ("estimates from the router's metrics and configured prices; they exclude provider discounts "
                 "and batch pricing")


@dataclass(frozen=True)
class Counters:
    """increase() of each router counter over the window, keyed by its labels."""

    requests: dict[tuple[str, str, str, str], float] = field(default_factory=dict)  # route, tier, upstream, outcome
    prompt_tokens: dict[str, float] = field(default_factory=dict)  # by upstream
    completion_tokens: dict[str, float] = field(default_factory=dict)
    cached_tokens: dict[str, float] = field(default_factory=dict)
    cache_write_tokens: dict[str, float] = field(default_factory=dict)  # an upstream absent: not counted
    cost: dict[str, float] = field(default_factory=dict)
    escalations: dict[tuple[str, str], float] = field(default_factory=dict)  # route, reason


@dataclass(frozen=True)
class GPUCost:
    dollars_per_gpu_hour: float
    gpus: int  # replicas x gpu.count


@dataclass
class Cell:
    """One (route, tier, upstream) with its attributed counts."""

    route: str
    tier: str
    upstream: str
    requests: float = 0.0
    cache_hits: float = 0.0
    share_of_upstream: float = 0.0  # of the upstream's billed requests
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cached_tokens: float = 0.0
    token_dollars: float = 0.0
    cache_saving_dollars: float = 0.0
    gpu_dollars: float = 0.0

    def usage(self) -> Usage:
        return Usage(prompt=round(self.prompt_tokens), completion=round(self.completion_tokens),
                     cached=round(self.cached_tokens), cache_written=0)


def billed(outcome: str) -> bool:
    """Outcomes where the request reached its upstream (and may have used tokens)."""
    return outcome != "cache_hit" and not outcome.startswith("error_") and outcome != "client_closed"


def cells(c: Counters, pricing: dict[str, Pricing], gpu: dict[str, GPUCost] | None = None,
          window_hours: float = 0.0) -> list[Cell]:
    """Every (route, tier, upstream) with requests in the window, with its share of its upstream's
    tokens, dollars and (allocation basis: reserved GPUs are paid whether busy or not) GPU-hours."""
    gpu = gpu or {}
    per_upstream: dict[str, float] = defaultdict(float)
    out: dict[tuple[str, str, str], Cell] = {}
    for (route, tier, upstream, outcome), n in c.requests.items():
        if upstream == "-" or n <= 0:  # refused before any tier was chosen
            continue
        cell = out.setdefault((route, tier, upstream), Cell(route, tier, upstream))
        cell.requests += n
        if outcome == "cache_hit":
            cell.cache_hits += n
        elif billed(outcome):
            per_upstream[upstream] += n
    billed_by_cell: dict[tuple[str, str, str], float] = defaultdict(float)
    for (route, tier, upstream, outcome), n in c.requests.items():
        if upstream != "-" and n > 0 and billed(outcome):
            billed_by_cell[(route, tier, upstream)] += n
    for key, cell in out.items():
        total = per_upstream.get(cell.upstream, 0.0)
        f = billed_by_cell[key] / total if total else 0.0
        u = cell.upstream
        cell.share_of_upstream = f
        cell.prompt_tokens = f * c.prompt_tokens.get(u, 0.0)
        cell.completion_tokens = f * c.completion_tokens.get(u, 0.0)
        cell.cached_tokens = f * c.cached_tokens.get(u, 0.0)
        cell.token_dollars = f * c.cost.get(u, 0.0)
        p = pricing.get(u)
        if p is not None and p.cached_input_per_mtok is not None:
            cell.cache_saving_dollars = cell.cached_tokens * (p.input_per_mtok - p.cached_input_per_mtok) / 1e6
        g = gpu.get(u)
        if g is not None:
            cell.gpu_dollars = f * g.dollars_per_gpu_hour * g.gpus * window_hours
    return sorted(out.values(), key=lambda x: (x.route, x.tier, x.upstream))


def unattributed_dollars(c: Counters, cs: list[Cell]) -> float:
    """Dollars counted for upstreams that no request in the window reached (a counter reset, say)."""
    seen = {x.upstream for x in cs if x.share_of_upstream > 0}
    return sum(v for u, v in c.cost.items() if u not in seen)


def parse_group_by(raw: str) -> list[str]:
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    if "tenant" in keys:
        raise ValueError("tenant: the router's metrics carry no tenant label (tenants appear in its limits, not in "
                         "Prometheus); group by route, tier and upstream")
    bad = [k for k in keys if k not in GROUP_KEYS]
    if bad or not keys:
        raise ValueError(f"{raw!r}: group by a comma-separated list of {', '.join(GROUP_KEYS)}")
    return list(dict.fromkeys(keys))


def report(cs: list[Cell], group_by: list[str], unattributed: float, window: str, gpu_priced: bool) -> dict[str, Any]:
    """Rows summed by the group keys, a total, and the basis of each figure."""
    groups: dict[tuple[str, ...], dict[str, float]] = {}
    for x in cs:
        key = tuple(getattr(x, k) for k in group_by)
        g = groups.setdefault(key, defaultdict(float))
        g["requests"] += x.requests
        g["cache_hits"] += x.cache_hits
        g["prompt_tokens"] += x.prompt_tokens
        g["completion_tokens"] += x.completion_tokens
        g["cached_tokens"] += x.cached_tokens
        g["token_dollars"] += x.token_dollars
        g["cache_saving_dollars"] += x.cache_saving_dollars
        g["gpu_dollars"] += x.gpu_dollars
    rows = []
    for key, g in sorted(groups.items()):
        row: dict[str, Any] = dict(zip(group_by, key, strict=True))
        row.update(_rounded(g))
        row["dollars_per_1k_requests"] = round(1000 * g["token_dollars"] / g["requests"], 10) if g["requests"] else None
        rows.append(row)
    totals: dict[str, float] = defaultdict(float)
    for g in groups.values():
        for k, v in g.items():
            totals[k] += v
    totals["token_dollars"] += unattributed
    return {
        "window": window,
        "group_by": group_by,
        "rows": rows,
        "total": _rounded(totals) | {"unattributed_dollars": round(unattributed, 10)},
        "basis": {
            "token_dollars": "usage: oculis_cost_dollars_total, shared out by each route/tier's share of the "
                             "upstream's requests",
            "cache_saving_dollars": "cached prompt tokens x (input price - cached input price)",
            "gpu_dollars": ("allocation: pricing.gpuHourDollars x GPUs x window hours, shared out by requests"
                            if gpu_priced else "no upstream has pricing.gpuHourDollars"),
        },
        "note": ESTIMATE_NOTE,
    }


def _rounded(g: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("requests", "cache_hits", "prompt_tokens", "completion_tokens", "cached_tokens"):
        out[k] = round(g.get(k, 0.0))
    for k in ("token_dollars", "cache_saving_dollars", "gpu_dollars"):
        out[k] = round(g.get(k, 0.0), 10)
    return out


def reprice(cell: Cell, pricing: Pricing) -> float:
    """The cell's tokens at another upstream's prices (the all-strongest-tier baseline)."""
    return cost_dollars(pricing, cell.usage())
