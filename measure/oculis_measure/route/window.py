"""`oculis route analyze --since 7d`: a route's tier table over a window of the router's counters.
Pure functions, no I/O.

Per tier: requests, share, average cost, window cost and estimated monthly cost; the total; the
all-strongest-tier baseline, where each request's real tokens are re-priced at the strongest tier's
prices (not its average cost times all requests: a tier's prompts are not the strongest tier's
prompts); the saving; the escalation rate with its denominator. The monthly figure is the window's
cost scaled by 30 days / the window length, and the table says so.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from oculis import Pricing, Route
from oculis.router import Upstream
from oculis_measure.cost.core import Cell, Counters, cells, reprice
from oculis_measure.route import cascade

MONTH_DAYS = 30
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}


def parse_duration(raw: str) -> timedelta:
    """A Prometheus duration (`7d`, `1h30m`, `90s`) as a timedelta; ValueError naming the fix."""
    text = raw.strip()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{raw!r} is not a duration; use Prometheus units ms, s, m, h, d, w, y, e.g. 7d or 1h30m")
    seconds = sum(int(n) * _UNIT_SECONDS[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"{raw!r} is an empty window; give a positive duration such as 7d")
    return timedelta(seconds=seconds)


def parse_time(raw: str, flag: str) -> datetime:
    """An RFC 3339 timestamp (`2026-11-24T00:00:00Z`); ValueError naming the flag otherwise."""
    try:
        t = datetime.fromisoformat(raw.strip().replace("z", "Z"))
    except ValueError:
        raise ValueError(f"{flag} {raw!r} is not an RFC 3339 time; write e.g. 2026-11-24T00:00:00Z") from None
    if t.tzinfo is None:
        raise ValueError(f"{flag} {raw!r} has no time zone; append Z (UTC) or an offset such as +01:00")
    return t.astimezone(UTC)


def window(since: str | None, start: str | None, end: str | None, now: datetime) -> tuple[datetime, datetime]:
    """The window from `--since` (ending now) or `--from`/`--to` (`--to` defaults to now)."""
    if since is not None and start is not None:
        raise ValueError("give either --since or --from/--to, not both")
    if since is not None:
        return now - parse_duration(since), now
    if start is None:
        raise ValueError("give --since DURATION (e.g. 7d) or --from RFC3339 [--to RFC3339]")
    t0 = parse_time(start, "--from")
    t1 = parse_time(end, "--to") if end is not None else now
    if t1 <= t0:
        raise ValueError(f"--to {t1.isoformat()} is not after --from {t0.isoformat()}; swap them")
    return t0, t1


def describe_window(t0: datetime, t1: datetime) -> str:
    return f"{t0.strftime('%Y-%m-%dT%H:%M:%SZ')} .. {t1.strftime('%Y-%m-%dT%H:%M:%SZ')} ({_human(t1 - t0)})"


def _human(d: timedelta) -> str:
    s = d.total_seconds()
    if s >= 86400:
        return f"{s / 86400:g} d"
    if s >= 3600:
        return f"{s / 3600:g} h"
    return f"{s:g} s"


def table(route: Route, c: Counters, pricing: dict[str, Pricing], window_seconds: float) -> dict[str, Any]:
    """The seed's per-tier table for one route, as a JSON-ready dict."""
    scale = MONTH_DAYS * 86400 / window_seconds
    mine = [x for x in cells(c, pricing) if x.route == route.name]
    strongest = route.tiers[-1]
    strong_price = pricing.get(strongest.upstream, Pricing())
    by_tier: dict[str, list[Cell]] = {t.name: [] for t in route.tiers}
    for x in mine:
        by_tier.setdefault(x.tier, []).append(x)
    total_requests = sum(x.requests for x in mine)
    rows, total_cost, baseline = [], 0.0, 0.0
    for name, xs in by_tier.items():
        n = sum(x.requests for x in xs)
        cost = sum(x.token_dollars for x in xs)
        base = sum(reprice(x, strong_price) for x in xs)
        total_cost += cost
        baseline += base
        upstreams = sorted({x.upstream for x in xs}) or [t.upstream for t in route.tiers if t.name == name]
        rows.append({"tier": name, "upstream": ",".join(upstreams), "requests": round(n),
                     "share": round(n / total_requests, 4) if total_requests else 0.0,
                     "avg_cost": round(cost / n, 10) if n else None, "cost": round(cost, 10),
                     "est_monthly": round(cost * scale, 2)})
    escalated = {reason: v for (r, reason), v in c.escalations.items() if r == route.name and v > 0}
    n_esc = sum(escalated.values())
    saving = baseline - total_cost
    return {
        "route": route.name,
        "tiers": rows,
        "total": {"requests": round(total_requests), "cost": round(total_cost, 10),
                  "est_monthly": round(total_cost * scale, 2)},
        "baseline": {"tier": strongest.name, "upstream": strongest.upstream, "cost": round(baseline, 10),
                     "est_monthly": round(baseline * scale, 2),
                     "rule": f"each request's real tokens re-priced at {strongest.upstream}'s prices"},
        "saving": {"dollars": round(saving, 10), "est_monthly": round(saving * scale, 2),
                   "percent": round(100 * saving / baseline, 2) if baseline else None},
        "escalation": {"escalated": round(n_esc), "of_requests": round(total_requests),
                       "rate": round(n_esc / total_requests, 4) if total_requests else None,
                       "by_reason": {k: round(v) for k, v in sorted(escalated.items())},
                       "rule": "requests moved up a tier / all requests the route answered in the window"},
        "monthly_scaling": f"est_monthly = window cost x {MONTH_DAYS} d / "
                           f"{_human(timedelta(seconds=window_seconds))} = x {scale:.4g}",
        "scale": round(scale, 10),
    }


def window_cascade(route: Route, upstreams: dict[str, Upstream], c: Counters, rate: float | None) -> dict[str, Any]:
    """Routed-only vs cascade cost over the window's tier split and tokens. p_esc: measured in the
    window when the route checks answers and they produced any, else `rate` (the flag), else 0."""
    checked = {route.tiers[i].name for i in cascade.checked_tiers(route, upstreams, False)}
    measured, what = cascade.window_rate(route, checked, c.requests, c.escalations) if checked else (None, "")
    p, what_if, source = cascade.resolve_rate(route, measured, what, rate)
    tiers, why = cascade.tiers_for(route, upstreams, p, what_if)
    index = {t.name: i for i, t in enumerate(route.tiers)}
    pricing = {name: up.pricing for name, up in upstreams.items()}
    requests = [cascade.Request(index[x.tier], x.prompt_tokens, x.completion_tokens, x.requests, x.cached_tokens)
                for x in cells(c, pricing) if x.route == route.name and x.tier in index and x.requests > 0]
    return cascade.report(tiers, requests, source, (
        "the window's tokens per tier (the router's counters, shared out by requests as in the table above), each "
        "request counted at the tier that answered it; a replaced answer's tokens are already in its own tier's"), why)
