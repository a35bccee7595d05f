"""Cost attribution from the router's counters over a window: pure functions, no I/O.

The router counts requests by (route, tier, upstream, outcome) but tokens and dollars by upstream
only (runtime/oculis_router/metrics.py). A route/tier's share of an upstream's tokens and dollars is
therefore its share of the calls that reached that upstream: the answers it gave (outcomes other
than cache_hit and the router's own refusals), the answers a later tier replaced
(oculis_answers_replaced_total, charged to the tier and route that produced them) and, for a
verifier upstream, its gradings (oculis_answer_grades_total, charged to the route whose answers it
graded, as tier "(verifier)"). That is exact when an upstream serves one route and tier, and an
estimate weighted by call count when several share it; the report says so.

LoRA adapters are the exception: the router also counts each adapter's tokens and dollars exactly
(oculis_adapter_*_total by upstream and adapter). The rows of an adapter's calls (route label
`<upstream or route>/<adapter>`, or a route's tier that names the adapter) take those counters, and the
rest of the upstream's tokens and dollars is shared by calls among its other rows, so the rows agree
with the adapters table. Cached prompt tokens have no per-adapter counter: each row gets the
upstream's cached tokens in proportion to its prompt tokens (the call share when no adapter is counted).

GPU dollars are on the allocation basis: a priced upstream's reserved GPUs cost their hours whether
busy or not, shared out by the same calls, and an upstream no call reached is an "(idle)" row.

Dollars come from `oculis_cost_dollars_total` (priced by the router with the same
`usage.cost_dollars`), so the totals agree with the metric; re-pricing (baselines, cache savings)
goes through `usage.cost_dollars` too: one cost formula in one place.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from oculis import Pricing, Route
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
    # route, tier, upstream: the tier the route sent each request to first (before failover or replacement)
    routed: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # route, tier, upstream: answers the tier produced (billed) that a later tier's answer replaced
    replaced: dict[tuple[str, str, str], float] = field(default_factory=dict)
    gradings: dict[tuple[str, str, str], float] = field(default_factory=dict)  # route, verifier upstream, outcome
    # upstream, adapter: the LoRA adapters' own counters (oculis_adapter_*_total), exact per adapter
    adapter_prompt_tokens: dict[tuple[str, str], float] = field(default_factory=dict)
    adapter_completion_tokens: dict[tuple[str, str], float] = field(default_factory=dict)
    adapter_cost: dict[tuple[str, str], float] = field(default_factory=dict)
    # the Batch API's lines (oculis_batch_*_total, also inside the counters above): route, outcome / kind / upstream
    batch_lines: dict[tuple[str, str], float] = field(default_factory=dict)  # route, outcome (ok, error, expired)
    batch_tokens: dict[tuple[str, str], float] = field(default_factory=dict)  # route, kind (prompt, completion)
    batch_cost: dict[tuple[str, str], float] = field(default_factory=dict)  # route, upstream


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
    requests: float = 0.0  # taken here (the final tier), any outcome: errors and broken streams too
    answered: float = 0.0  # of those, answered (ok, or a cache hit): what $/1k requests divides by (QA3 Part 2 #8)
    cache_hits: float = 0.0
    routed: float = 0.0  # requests the route sent here first
    replaced: float = 0.0  # answers produced here that a later tier replaced (billed all the same)
    gradings: float = 0.0  # a verifier's gradings of this route's answers
    calls: float = 0.0  # billed calls: answers given + answers replaced + gradings
    share_of_upstream: float = 0.0  # of the upstream's billed calls
    cache_write_tokens: float = 0.0
    prompt_tokens: float = 0.0
    completion_tokens: float = 0.0
    cached_tokens: float = 0.0
    token_dollars: float = 0.0
    cache_saving_dollars: float = 0.0
    gpu_dollars: float = 0.0
    adapter: str | None = None  # the LoRA adapter whose own counters gave its tokens and dollars

    def usage(self) -> Usage:
        return Usage(prompt=round(self.prompt_tokens), completion=round(self.completion_tokens),
                     cached=round(self.cached_tokens), cache_written=0)


VERIFIER_TIER = "(verifier)"  # the tier label of a verifier's gradings
IDLE = "(idle)"  # the route label of a GPU-priced upstream no call reached in the window
GRADED = ("pass", "fail", "unscored")  # oculis_answer_grades_total outcomes where the verifier answered (billed)


ANSWERED = ("ok", "cache_hit")  # oculis_requests_total outcomes where the client got its answer


def billed(outcome: str) -> bool:
    """Outcomes where the request reached its upstream (and may have used tokens)."""
    return outcome != "cache_hit" and not outcome.startswith("error_") and outcome != "client_closed"


def cells(c: Counters, pricing: dict[str, Pricing], gpu: dict[str, GPUCost] | None = None,
          window_hours: float = 0.0, tier_adapters: dict[tuple[str, str], str] | None = None) -> list[Cell]:
    """Every (route, tier, upstream) with requests or calls in the window, with its share of its
    upstream's tokens, dollars and (allocation basis: reserved GPUs are paid whether busy or not)
    GPU-hours; plus an "(idle)" cell per GPU-priced upstream no call reached. `tier_adapters`:
    (route, tier) -> the LoRA adapter that tier asks for (the config's `tiers[].adapter`)."""
    from oculis_measure.cache.advise import pricing_saving

    gpu = gpu or {}
    out: dict[tuple[str, str, str], Cell] = {}

    def cell(route: str, tier: str, upstream: str) -> Cell:
        return out.setdefault((route, tier, upstream), Cell(route, tier, upstream))

    for (route, tier, upstream, outcome), n in c.requests.items():
        if upstream == "-" or n <= 0:  # refused before any tier was chosen
            continue
        x = cell(route, tier, upstream)
        x.requests += n
        if outcome in ANSWERED:
            x.answered += n
        if outcome == "cache_hit":
            x.cache_hits += n
        elif billed(outcome):
            x.calls += n
    for (route, tier, upstream), n in c.replaced.items():
        if n > 0:
            x = cell(route, tier, upstream)
            x.replaced += n
            x.calls += n
    for (route, verifier, outcome), n in c.gradings.items():
        if n > 0 and outcome in GRADED:
            x = cell(route, VERIFIER_TIER, verifier)
            x.gradings += n
            x.calls += n
    for (route, tier, upstream), n in c.routed.items():
        if n > 0:
            cell(route, tier, upstream).routed += n
    per_upstream: dict[str, float] = defaultdict(float)
    for x in out.values():
        per_upstream[x.upstream] += x.calls
    exact = adapter_cells(c, list(out.values()), tier_adapters or {})
    pool = _remainders(c, per_upstream, [(out[k], key) for k, key in exact.items()])
    for x in out.values():
        total = per_upstream.get(x.upstream, 0.0)
        x.share_of_upstream = f = x.calls / total if total else 0.0
        u = x.upstream
        key = exact.get((x.route, x.tier, u))
        if key is not None:  # the adapter's own counters, shared by calls only among the adapter's rows
            x.adapter = key[1]
            calls = pool.adapter_calls[key]
            a = x.calls / calls if calls else 0.0
            x.prompt_tokens = a * c.adapter_prompt_tokens.get(key, 0.0)
            x.completion_tokens = a * c.adapter_completion_tokens.get(key, 0.0)
            x.token_dollars = a * c.adapter_cost.get(key, 0.0)
        else:  # the upstream's remainder once its counted adapters are taken out, by calls
            calls = pool.calls.get(u, 0.0)
            r = x.calls / calls if calls else 0.0
            x.prompt_tokens = r * pool.prompt_tokens.get(u, 0.0)
            x.completion_tokens = r * pool.completion_tokens.get(u, 0.0)
            x.token_dollars = r * pool.cost.get(u, 0.0)
        prompt = c.prompt_tokens.get(u, 0.0)
        t = x.prompt_tokens / prompt if prompt else f  # no per-adapter cached counter: by prompt tokens
        x.cached_tokens = t * c.cached_tokens.get(u, 0.0)
        x.cache_write_tokens = t * c.cache_write_tokens.get(u, 0.0)
        p = pricing.get(u)
        if p is not None:
            x.cache_saving_dollars = pricing_saving(p, x.cached_tokens, x.cache_write_tokens)
        g = gpu.get(u)
        if g is not None:
            x.gpu_dollars = f * g.dollars_per_gpu_hour * g.gpus * window_hours
    for u, g in gpu.items():
        if not per_upstream.get(u):
            cell(IDLE, "-", u).gpu_dollars = g.dollars_per_gpu_hour * g.gpus * window_hours
    return sorted(out.values(), key=lambda x: (x.route, x.tier, x.upstream))


def tier_adapters(routes: Iterable[Route]) -> dict[tuple[str, str], str]:
    """(route, tier) -> the LoRA adapter the tier asks for, of every route's tiers that name one."""
    return {(r.name, t.name): t.adapter for r in routes for t in r.tiers if t.adapter is not None}


def adapter_of(route: str, tier: str, tier_adapters: dict[tuple[str, str], str]) -> str | None:
    """The LoRA adapter a row's calls asked for: the `<adapter>` of a `<upstream or route>/<adapter>`
    route label (names of routes and upstreams have no "/"), or the adapter its route's tier names."""
    if tier == VERIFIER_TIER:  # a verifier grades with its base model
        return None
    base, sep, adapter = route.rpartition("/")
    if sep and base and adapter:
        return adapter
    return tier_adapters.get((route, tier))


def adapter_cells(c: Counters, cs: list[Cell], tier_adapters: dict[tuple[str, str], str]
                  ) -> dict[tuple[str, str, str], tuple[str, str]]:
    """(route, tier, upstream) -> (upstream, adapter) for each billed row of an adapter the router counted."""
    counted = set(c.adapter_cost) | set(c.adapter_prompt_tokens) | set(c.adapter_completion_tokens)
    out = {}
    for x in cs:
        a = adapter_of(x.route, x.tier, tier_adapters)
        if x.calls > 0 and a is not None and (x.upstream, a) in counted:
            out[(x.route, x.tier, x.upstream)] = (x.upstream, a)
    return out


@dataclass
class _Pool:
    """Per upstream, what is left for its rows without adapter counters; per adapter, its rows' calls."""

    calls: dict[str, float] = field(default_factory=dict)
    prompt_tokens: dict[str, float] = field(default_factory=dict)
    completion_tokens: dict[str, float] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    adapter_calls: dict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))


def _remainders(c: Counters, per_upstream: dict[str, float], exact: list[tuple[Cell, tuple[str, str]]]) -> _Pool:
    pool = _Pool(calls=dict(per_upstream), prompt_tokens=dict(c.prompt_tokens),
                 completion_tokens=dict(c.completion_tokens), cost=dict(c.cost))
    for x, key in exact:
        pool.adapter_calls[key] += x.calls
        pool.calls[x.upstream] = pool.calls.get(x.upstream, 0.0) - x.calls
    for key in {key for _, key in exact}:
        u = key[0]
        # Prometheus extrapolates each increase() on its own: never below 0 for the other rows
        pool.prompt_tokens[u] = max(0.0, pool.prompt_tokens.get(u, 0.0) - c.adapter_prompt_tokens.get(key, 0.0))
        pool.completion_tokens[u] = max(0.0, pool.completion_tokens.get(u, 0.0)
                                        - c.adapter_completion_tokens.get(key, 0.0))
        pool.cost[u] = max(0.0, pool.cost.get(u, 0.0) - c.adapter_cost.get(key, 0.0))
    return pool


def adapter_rows(c: Counters) -> list[dict[str, Any]]:
    """Per (upstream, LoRA adapter): its tokens and dollars, counted per call by the router (exact, not shared
    out), and its share of the upstream's dollars (the rest is the base model's and the other adapters')."""
    rows = []
    for key in sorted(set(c.adapter_cost) | set(c.adapter_prompt_tokens) | set(c.adapter_completion_tokens)):
        upstream, adapter = key
        dollars = c.adapter_cost.get(key, 0.0)
        if not (dollars or c.adapter_prompt_tokens.get(key) or c.adapter_completion_tokens.get(key)):
            continue  # no call in the window (an adapter since removed, say): noise, not a row (QA3 Part 2 #19)
        total = c.cost.get(upstream, 0.0)
        rows.append({"upstream": upstream, "adapter": adapter,
                     "prompt_tokens": round(c.adapter_prompt_tokens.get(key, 0.0)),
                     "completion_tokens": round(c.adapter_completion_tokens.get(key, 0.0)),
                     "token_dollars": round(dollars, 10),
                     "share_of_upstream_dollars": round(dollars / total, 4) if total else None})
    return rows


def batch_rows(c: Counters) -> list[dict[str, Any]]:
    """Per (route, upstream): the Batch API's spend, apart from interactive traffic (counted per line by the
    router, exact; part of the rows above), and its share of the upstream's dollars. A route's lines and
    tokens have no upstream label: they are on the route's first row (its lines reached the upstreams below
    it)."""
    rows = []
    routes = sorted({r for r, _ in c.batch_cost} | {r for r, _ in c.batch_lines} | {r for r, _ in c.batch_tokens})
    for route in routes:
        ups = sorted(u for r, u in c.batch_cost if r == route) or ["-"]
        lines = {o: c.batch_lines.get((route, o), 0.0) for o in ("ok", "error", "expired")}
        if not any(lines.values()) and not any(c.batch_cost.get((route, u)) for u in ups):
            continue  # no line in the window
        for i, upstream in enumerate(ups):
            dollars = c.batch_cost.get((route, upstream), 0.0)
            total = c.cost.get(upstream, 0.0)
            first = i == 0
            rows.append({"route": route, "upstream": upstream,
                         "lines_ok": round(lines["ok"]) if first else None,
                         "lines_failed": round(lines["error"] + lines["expired"]) if first else None,
                         "prompt_tokens": round(c.batch_tokens.get((route, "prompt"), 0.0)) if first else None,
                         "completion_tokens": round(c.batch_tokens.get((route, "completion"), 0.0)) if first else None,
                         "token_dollars": round(dollars, 10),
                         "share_of_upstream_dollars": round(dollars / total, 4) if total else None})
    return rows


def unattributed_dollars(c: Counters, cs: list[Cell]) -> float:
    """Dollars counted for an upstream that no row took: no request in the window reached it (a counter
    reset, say), or what its adapters' rows left with no other row to take it."""
    taken: dict[str, float] = defaultdict(float)
    for x in cs:
        taken[x.upstream] += x.token_dollars
    left = [v - taken.get(u, 0.0) for u, v in c.cost.items()]
    return sum(d for d, v in zip(left, c.cost.values(), strict=True) if d > 1e-9 * v)  # not float dust


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
        g["answered"] += x.answered
        g["cache_hits"] += x.cache_hits
        g["calls"] += x.calls
        g["replaced_answers"] += x.replaced
        g["gradings"] += x.gradings
        g["prompt_tokens"] += x.prompt_tokens
        g["completion_tokens"] += x.completion_tokens
        g["cached_tokens"] += x.cached_tokens
        g["token_dollars"] += x.token_dollars
        g["cache_saving_dollars"] += x.cache_saving_dollars
        g["gpu_dollars"] += x.gpu_dollars
    rows = []
    for key, g in sorted(groups.items()):
        if not any(g.values()):  # a row with nothing in the window (a routed count kept under another label)
            continue
        row: dict[str, Any] = dict(zip(group_by, key, strict=True))
        row.update(_rounded(g))
        # per answered request: a failed one is no unit of service (it made the figure look cheaper: QA3 Part 2 #8)
        row["dollars_per_1k_requests"] = round(1000 * g["token_dollars"] / g["answered"], 10) if g["answered"] else None
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
                             "upstream's calls (answers given, answers a later tier replaced, a verifier's gradings "
                             "as tier (verifier)); a LoRA adapter's rows (<upstream or route>/<adapter>, a tier's "
                             "adapter) take its own oculis_adapter_*_total, the other rows share the rest",
            "cache_saving_dollars": "net: cached prompt tokens x (input - cached input price) - cache-write tokens x "
                                    "(cache-write - input price), as cache advise's saving_dollars",
            "gpu_dollars": ("allocation: pricing.gpuHourDollars x GPUs x window hours of every priced upstream, "
                            "shared out by the calls column; an upstream no call reached is an (idle) row"
                            if gpu_priced else "no upstream has pricing.gpuHourDollars"),
        },
        "note": ESTIMATE_NOTE,
    }


def _rounded(g: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in ("requests", "answered", "calls", "replaced_answers", "gradings", "cache_hits", "prompt_tokens",
              "completion_tokens", "cached_tokens"):
        out[k] = round(g.get(k, 0.0))
    for k in ("token_dollars", "cache_saving_dollars", "gpu_dollars"):
        out[k] = round(g.get(k, 0.0), 10)
    return out


def reprice(cell: Cell, pricing: Pricing) -> float:
    """The cell's tokens at another upstream's prices (the all-strongest-tier baseline)."""
    return cost_dollars(pricing, cell.usage())
