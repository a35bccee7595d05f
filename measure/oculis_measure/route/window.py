"""`oculis route analyze --since 7d`: a route's tier table over a window of the router's counters.
Pure functions, no I/O.

Per tier: requests, share, average cost, window cost and estimated monthly cost; the total; the
all-strongest-tier baseline, where each request's real tokens are re-priced at the strongest tier's
prices (not its average cost times all requests: a tier's prompts are not the strongest tier's
prompts); the saving; the escalation rate with its denominator. The monthly figure is the window's
cost scaled by 30 days / the window length, and the table says so.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from oculis import Pricing, Route
from oculis.router_upstream import Upstream
from oculis_measure.cost.core import VERIFIER_TIER, Cell, Counters, cells, reprice
from oculis_measure.figures import share
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
    if end is None and t1 <= t0:
        raise ValueError(f"--from {t0.isoformat()} is in the future (now is {now.isoformat(timespec='seconds')}) "
                         "and no --to was given; give a past --from, or --since DURATION")
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


def of_route(label: str, route: str) -> bool:
    """Whether a counter's route label is the route's: its name, or `<route>/<adapter>` (a client asking for one
    of its adapters; the router counts routed requests under the route's name and the rest under this label,
    so reading only one left half the traffic out: QA3 Part 2 #2). Route and upstream names have no '/', and
    no route is named like an upstream, so the prefix is the route's alone."""
    return label == route or label.startswith(route + "/")


def table(route: Route, c: Counters, pricing: dict[str, Pricing], window_seconds: float,
          tier_adapters: dict[tuple[str, str], str] | None = None) -> dict[str, Any]:
    """The seed's per-tier table for one route, as a JSON-ready dict. Per tier: the requests it answered
    (final) and, from routers that count them, the requests the route sent it first (routed) and its
    answers a later tier replaced; its cost is every answer it produced, replaced ones included, and the
    verifier's gradings of the route's answers are a row of their own, so the total is what the route cost.
    `tier_adapters` (cost.core.tier_adapters of every route): LoRA adapter calls take their own counters."""
    scale = MONTH_DAYS * 86400 / window_seconds
    mine = [x for x in cells(c, pricing, tier_adapters=tier_adapters) if of_route(x.route, route.name)]
    strongest = route.tiers[-1]
    strong_price = pricing.get(strongest.upstream, Pricing())
    by_tier: dict[str, list[Cell]] = {t.name: [] for t in route.tiers}
    graders = [x for x in mine if x.tier == VERIFIER_TIER]
    for x in mine:
        if x.tier != VERIFIER_TIER:
            by_tier.setdefault(x.tier, []).append(x)
    total_requests = sum(x.requests for xs in by_tier.values() for x in xs)
    total_routed = sum(x.routed for xs in by_tier.values() for x in xs)
    rows, total_cost, baseline = [], 0.0, 0.0
    for name, xs in by_tier.items():
        n = sum(x.requests for x in xs)
        answered = sum(x.answered for x in xs)
        cost = sum(x.token_dollars for x in xs)
        # the baseline re-prices the answers the route gave (a replaced answer is no request of its own)
        base = sum(reprice(x, strong_price) * ((x.calls - x.replaced) / x.calls if x.calls else 1.0) for x in xs)
        total_cost += cost
        baseline += base
        upstreams = sorted({x.upstream for x in xs}) or [t.upstream for t in route.tiers if t.name == name]
        row = {"tier": name, "upstream": ",".join(upstreams), "requests": round(n), "answered": round(answered),
               "share": share(n, total_requests, "no request in the window", 4),
               "avg_cost": round(cost / n, 10) if n else None, "cost": round(cost, 10),
               "est_monthly": round(cost * scale, 10)}
        if total_routed:
            routed, replaced = sum(x.routed for x in xs), sum(x.replaced for x in xs)
            row |= {"routed": round(routed), "routed_share": round(routed / total_routed, 4),
                    "replaced_answers": round(replaced)}
        rows.append(row)
    for x in graders:
        total_cost += x.token_dollars
        rows.append({"tier": VERIFIER_TIER, "upstream": x.upstream, "requests": 0, "share": 0.0,
                     "gradings": round(x.gradings), "avg_cost": None, "cost": round(x.token_dollars, 10),
                     "est_monthly": round(x.token_dollars * scale, 10)})
    escalated: dict[str, float] = {}
    for (r, reason), v in c.escalations.items():
        if of_route(r, route.name) and v > 0:
            escalated[reason] = escalated.get(reason, 0.0) + v
    n_esc = sum(escalated.values())
    saving = baseline - total_cost
    return {
        "route": route.name,
        "tiers": rows,
        "total": {"requests": round(total_requests),
                  "answered": round(sum(x.answered for xs in by_tier.values() for x in xs)),
                  "cost": round(total_cost, 10),
                  "est_monthly": round(total_cost * scale, 10)},
        "baseline": {"tier": strongest.name, "upstream": strongest.upstream, "cost": round(baseline, 10),
                     "est_monthly": round(baseline * scale, 10),
                     "rule": f"each request's real tokens re-priced at {strongest.upstream}'s prices"},
        "saving": {"dollars": round(saving, 10), "est_monthly": round(saving * scale, 10),
                   "percent": round(100 * saving / baseline, 2) if baseline else None},
        "escalation": {"escalated": round(n_esc), "of_requests": round(total_requests),
                       "rate": round(n_esc / total_requests, 4) if total_requests else None,
                       "by_reason": {k: round(v) for k, v in sorted(escalated.items())},
                       "rule": "requests moved up a tier / all requests the route took in the window, any outcome"},
        "attribution": ("routed: the tier the route sent each request to first (oculis_routed_requests_total); "
                        "requests: the tier that answered; cost: every answer a tier produced, replaced ones "
                        "included, and the verifier's gradings as (verifier)" if total_routed else
                        "requests and cost by the tier that answered (this router does not count routed tiers: "
                        "a replaced answer's cost is in its own tier's, a tier that only produced replaced "
                        "answers shows 0 requests)"),
        "monthly_scaling": f"est_monthly = window cost x {MONTH_DAYS} d / "
                           f"{_human(timedelta(seconds=window_seconds))} = x {scale:.4g}",
        "scale": round(scale, 10),
    }


def window_cascade(route: Route, upstreams: dict[str, Upstream], c: Counters, rate: float | None,
                   tier_adapters: dict[tuple[str, str], str] | None = None) -> dict[str, Any]:
    """Routed-only vs cascade cost over the window. Where the router counts routed tiers, each request
    is placed at the tier it was routed to (never at the tier that answered: the cascade is not applied
    again on top of one the counters already observed), with that tier's tokens per answer, and p_esc is
    measured per tier: answers replaced / answers the tier produced. Otherwise the window's requests at
    the tier that answered, p_esc pooled (cascade.window_rate), the flag or 0."""
    checked = {route.tiers[i].name for i in cascade.checked_tiers(route, upstreams, False)}
    index = {t.name: i for i, t in enumerate(route.tiers)}
    pricing = {name: up.pricing for name, up in upstreams.items()}
    mine = [x for x in cells(c, pricing, tier_adapters=tier_adapters) if of_route(x.route, route.name)]
    routed = {name: sum(x.routed for x in mine if x.tier == name) for name in index}
    if sum(routed.values()) > 0:
        return _observed_cascade(route, upstreams, c, mine, routed, checked, rate)
    measured, what = cascade.window_rate(route, checked, c.requests, c.escalations) if checked else (None, "")
    p, what_if, source = cascade.resolve_rate(route, measured, what, rate)
    tiers, why = cascade.tiers_for(route, upstreams, p, what_if)
    requests = [cascade.Request(index[x.tier], x.prompt_tokens, x.completion_tokens, x.requests, x.cached_tokens)
                for x in mine if x.tier in index and x.requests > 0]
    return cascade.report(tiers, requests, source, (
        "the window's tokens per tier (the router's counters, shared out by requests as in the table above), each "
        "request counted at the tier that answered it; a replaced answer's tokens are already in its own tier's"), why)


def _observed_cascade(route: Route, upstreams: dict[str, Upstream], c: Counters, mine: list[Cell],
                      routed: dict[str, float], checked: set[str], rate: float | None) -> dict[str, Any]:
    index = {t.name: i for i, t in enumerate(route.tiers)}
    answered = {name: sum(v for (r, tier, _, outcome), v in c.requests.items()
                          if of_route(r, route.name) and tier == name and outcome == "ok") for name in index}
    replaced = {name: sum(x.replaced for x in mine if x.tier == name) for name in index}
    per_tier = {name: replaced[name] / (answered[name] + replaced[name])
                for name in checked if answered[name] + replaced[name] > 0}
    p, what_if, source = cascade.resolve_rate(route, None, "", rate)
    if per_tier:
        what_if, source = False, ("the window, per tier: oculis_answers_replaced_total / answers the tier produced "
                                  "(answered + replaced): " + ", ".join(
                                      f"{k} {replaced[k]:g}/{answered[k] + replaced[k]:g}" for k in sorted(per_tier)))
    tiers, why = cascade.tiers_for(route, upstreams, p, what_if)
    if per_tier:
        tiers = [dataclasses.replace(t, p_esc=per_tier.get(t.name, 0.0)) for t in tiers]
    calls = [x for x in mine if x.tier in index and x.calls > 0]
    n_all = sum(x.calls for x in calls)
    requests = []
    for name, n in routed.items():
        if n <= 0:
            continue
        xs = [x for x in calls if x.tier == name] or calls  # no billed answer there: the route's average
        k = sum(x.calls for x in xs) or n_all or 1.0
        requests.append(cascade.Request(index[name], n * sum(x.prompt_tokens for x in xs) / k,
                                        n * sum(x.completion_tokens for x in xs) / k, n,
                                        n * sum(x.cached_tokens for x in xs) / k))
    rep = cascade.report(tiers, requests, source, (
        "each request at the tier the route sent it to (oculis_routed_requests_total), with that tier's tokens "
        "per answer (the router's counters, shared out by calls); the cascade is projected from there, not "
        "applied again to answers that had already escalated"), why)
    _measured_gradings(rep, tiers, requests, sum(x.token_dollars for x in mine if x.tier == VERIFIER_TIER))
    spent = sum(x.token_dollars for x in mine)
    total = sum(routed.values())
    rep["observed"] = {"dollars": round(spent, 10), "per_request": round(spent / total, 10),
                       "what": "what the route cost in the window: every answer its tiers produced, replaced ones "
                               "included, and the verifier's gradings (the cascade as it ran)"}
    return rep


def _measured_gradings(rep: dict[str, Any], tiers: list[cascade.Tier], requests: list[cascade.Request],
                       measured: float) -> None:
    """The window counted what the route's gradings cost: that replaces the per-request estimate in the
    cascade (shared over the routed tiers as the estimate was), so the projection matches what ran."""
    est = [(r.tier, cascade.graded_cost(tiers, r)) for r in requests]
    total_est = sum(v for _, v in est)
    if measured <= 0 or total_est <= 0:
        return
    k = measured / total_est
    for i, v in est:
        rep["tiers"][i]["cascade_cost"] = round(rep["tiers"][i]["cascade_cost"] + (k - 1) * v, 10)
    tot, base = rep["total"], rep["all_strongest"]
    tot["cascade_cost"] = round(tot["cascade_cost"] + measured - total_est, 10)
    if tot["routed_only_cost"] > 0:
        tot["cascade_overhead_pct"] = round(100 * (tot["cascade_cost"] / tot["routed_only_cost"] - 1), 2)
    if base["cost"] > 0:
        base["cascade_saving_pct"] = round(100 * (1 - tot["cascade_cost"] / base["cost"]), 2)
    graders = rep["verifier"].get("graders", {})
    who = "; ".join(f"{up} grades {', '.join(names)}" for up, names in graders.items())
    rep["verifier"] |= {"dollars": round(measured, 10), "source": "measured in the window",
                        "why": f"${measured:.6g} in the cascade cost: {who}, measured in the window (the verifier "
                               "upstream's oculis_cost_dollars_total, shared out by this route's gradings)"}
