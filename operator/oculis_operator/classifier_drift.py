"""Classifier drift of one InferenceRoute: short-window tier shares and escalation rate against the
long-window baseline. Pure: the shell reads the router's counters (oculis_requests_total by route and
tier, oculis_escalations_total by route) over both windows and writes the verdict into
status.traffic and the ClassifierDrift condition.

Why: "a rising escalation rate means the classifier is drifting relative to your traffic"; a tier
whose share of requests moves by a large factor says the same about the mix it sends. A window with
too few requests, or no baseline at all, is Unknown: never a False that would hide a drift, never a
True raised on noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Window:
    """What the router counted for a route over one window."""

    seconds: float
    requests: dict[str, float] = field(default_factory=dict)  # tier -> requests answered there
    escalations: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.requests.values())

    def shares(self) -> dict[str, float]:
        total = self.total
        return {tier: n / total for tier, n in sorted(self.requests.items())} if total > 0 else {}

    def escalation_rate(self) -> float:
        return self.escalations / self.total if self.total > 0 else 0.0


@dataclass(frozen=True)
class DriftPolicy:
    factor: float = 2.0  # a figure this many times above (or, for a share, below) its baseline is drift
    min_requests: float = 20  # fewer requests in the short window: Unknown
    # Baselines below this are raised to it, so a rate that goes from 0 to 1 % is not "infinitely" higher.
    floor: float = 0.02


@dataclass(frozen=True)
class Verdict:
    status: str  # "True", "False" or "Unknown" (the ClassifierDrift condition)
    reason: str
    message: str
    traffic: dict[str, Any]  # status.traffic


def _window_text(seconds: float) -> str:
    return f"{seconds / 3600:g}h" if seconds >= 3600 and seconds % 3600 == 0 else (
        f"{seconds / 60:g}m" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g}s")


def _figures(w: Window) -> dict[str, Any]:
    return {"window": _window_text(w.seconds), "requests": round(w.total, 3),
            "tierShares": {t: round(s, 4) for t, s in w.shares().items()},
            "escalationRate": round(w.escalation_rate(), 4)}


def assess(short: Window, long: Window, policy: DriftPolicy = DriftPolicy()) -> Verdict:
    traffic = {**_figures(short), "baseline": _figures(long)}
    if long.total < policy.min_requests:
        return Verdict("Unknown", "NoBaseline", f"{long.total:g} requests in the {_window_text(long.seconds)} "
                       f"baseline, {policy.min_requests:g} needed", traffic)
    if short.total < policy.min_requests:
        return Verdict("Unknown", "TooFewRequests", f"{short.total:g} requests in the last "
                       f"{_window_text(short.seconds)}, {policy.min_requests:g} needed", traffic)
    moved: list[str] = []
    rate, base_rate = short.escalation_rate(), long.escalation_rate()
    if rate > policy.factor * max(base_rate, policy.floor):
        moved.append(f"escalation rate {rate:.1%} vs {base_rate:.1%} baseline")
    now, base = short.shares(), long.shares()
    for tier in sorted(set(now) | set(base)):
        s, b = now.get(tier, 0.0), base.get(tier, 0.0)
        if s > policy.factor * max(b, policy.floor) or (b >= policy.floor and s < b / policy.factor):
            moved.append(f"tier {tier} share {s:.1%} vs {b:.1%} baseline")
    windows = f"last {_window_text(short.seconds)} vs {_window_text(long.seconds)}"
    if moved:
        return Verdict("True", "ShiftedBeyondFactor", f"{'; '.join(moved)} ({windows}, factor "
                       f"{policy.factor:g}): the classifier no longer fits this route's traffic; retrain or "
                       "refit it (oculis route analyze)", traffic)
    return Verdict("False", "WithinBaseline", f"escalation rate {rate:.1%} vs {base_rate:.1%} baseline, tier "
                   f"shares within {policy.factor:g}x ({windows})", traffic)


def window_from(query: Any, namespace: str, route: str, seconds: float, offset_s: float = 0) -> Window | None:
    """Read one window of a route's router counters through `query` (PromQL instant query -> result
    vector or None). None when Prometheus gave nothing (the condition is then left as it was)."""
    rng = f"[{int(seconds)}s]" + (f" offset {int(offset_s)}s" if offset_s else "")
    sel = f'namespace=~"{namespace}|",route="{route}"'  # a router scraped outside the cluster has no namespace
    req = query(f'sum by (tier) (increase(oculis_requests_total{{{sel}}}{rng}))')
    esc = query(f'sum(increase(oculis_escalations_total{{{sel}}}{rng}))')
    if req is None or esc is None:
        return None
    requests: dict[str, float] = {}
    for r in req:
        try:
            value = float(r["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        tier = str(r.get("metric", {}).get("tier", ""))
        if value == value and tier:
            requests[tier] = requests.get(tier, 0.0) + value
    try:
        escalations = float(esc[0]["value"][1]) if esc else 0.0
    except (KeyError, IndexError, TypeError, ValueError):
        escalations = 0.0
    return Window(seconds, requests, escalations if escalations == escalations else 0.0)


def window_seconds(text: str) -> float:
    """`30s`, `15m`, `2h`, `1d` in seconds (the CRD's pattern has checked the shape)."""
    return float(int(text[:-1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[text[-1]])


def evaluate(query: Any, namespace: str, route: str, short_s: float, long_s: float,
             policy: DriftPolicy) -> Verdict | None:
    """Read both windows (the baseline is the long window just before the short one) and assess them;
    None when Prometheus gave nothing."""
    short = window_from(query, namespace, route, short_s)
    long = window_from(query, namespace, route, long_s, offset_s=short_s)
    if short is None or long is None:
        return None
    return assess(short, long, policy)
