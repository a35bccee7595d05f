"""Routing quality per kind of traffic: how well a route's classifier ranks a suite's prompts between
its cheapest and its strongest tier, for each `kind` the suite's lines name (RouteLLM's protocol).

A suite line's outcomes of the cheapest and the strongest tier give the two models' quality per prompt;
sending the prompts of highest complexity to the strong model first traces the share of the quality
gap recovered against the share of strong calls. APGR is the area under that curve (random routing:
0.5; a score that sends the wrong prompts up scores below it), CPT(50%) the share of strong calls that
recovers half the gap (random: 0.5), with a bootstrap 95% interval of APGR over the kind's prompts.
A kind whose interval does not lie above 0.5 is a WARN naming it: on that traffic the head is not
shown to route better than a coin, so tiering it by complexity is a guess. Pure functions, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from oculis_router import head_fit

OK, WARN, NOT_APPLICABLE = "OK", "WARN", "n/a"
MIN_ITEMS = 20  # fewer scored prompts of a kind tell nothing (random APGR's sd is ~0.07 at 72)
NO_KIND = "(no kind)"
FIX = ("fit the head on your labelled outcomes (`oculis classifier fit --suite ...`) or escalate on the answer "
       "(`escalation.on_answer`) before trusting tiering on it")


@dataclass(frozen=True)
class Scored:
    """One suite prompt: its kind, the route classifier's complexity, and the cheapest and strongest
    tiers' outcomes (None where the line has none)."""

    kind: str | None
    complexity: float
    weak: float | None  # correct (True/1) or a graded score in [0, 1]
    strong: float | None


@dataclass(frozen=True)
class KindRow:
    kind: str
    n: int  # lines of this kind
    scored: int  # lines with both outcomes
    weak_accuracy: float | None
    strong_accuracy: float | None
    apgr: float | None
    ci: tuple[float, float] | None
    cpt50: float | None
    verdict: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["ci"] = list(self.ci) if self.ci else None
        return d


def _r(v: float) -> float | None:
    return None if math.isnan(v) else round(v, 4)


def kind_row(kind: str, items: Sequence[Scored], n_boot: int = 300, seed: int = 0) -> KindRow:
    both = [i for i in items if i.weak is not None and i.strong is not None]
    n, m = len(items), len(both)
    if m == 0:
        return KindRow(kind, n, 0, None, None, None, None, None, NOT_APPLICABLE,
                       "no line has outcomes of both the cheapest and the strongest tier")
    score = np.array([i.complexity for i in both], float)
    weak = np.array([float(i.weak or 0) for i in both], float)
    strong = np.array([float(i.strong or 0) for i in both], float)
    wa, sa = float(weak.mean()), float(strong.mean())
    if wa == sa:
        return KindRow(kind, n, m, round(wa, 4), round(sa, 4), None, None, None, NOT_APPLICABLE,
                       "the cheapest and the strongest tier are equally good here: any routing is as good")
    a = head_fit.apgr(score, weak, strong, seed)
    c50 = head_fit.cpt(score, weak, strong, 0.5, seed)
    lo, hi = head_fit.bootstrap({"route": score}, weak, strong, n_boot, seed)["route"]
    ci = None if math.isnan(lo) else (round(lo, 4), round(hi, 4))
    if sa < wa:
        verdict, why = WARN, (f"the cheapest tier is better than the strongest here ({wa:.3f} vs {sa:.3f}): "
                              "escalating this traffic loses quality")
    elif m < MIN_ITEMS:
        verdict, why = WARN, f"{m} scored lines: too few to tell the head from random (need {MIN_ITEMS}+)"
    elif ci is not None and ci[1] < 0.5:
        verdict, why = WARN, f"worse than random: APGR {a:.3f}, 95% CI [{ci[0]:.3f}, {ci[1]:.3f}] below 0.5"
    elif ci is None or ci[0] <= 0.5:
        shown = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-"
        verdict, why = WARN, f"not better than random: APGR {a:.3f}, 95% CI {shown} reaches 0.5"
    else:
        verdict, why = OK, "better than random (the 95% CI lies above 0.5)"
    return KindRow(kind, n, m, round(wa, 4), round(sa, 4), _r(a), ci, _r(c50), verdict, why)


def by_kind(items: Sequence[Scored], n_boot: int = 300, seed: int = 0) -> list[KindRow]:
    """A row per kind in first-seen order (lines without a kind under NO_KIND), then `all` when the
    suite names more than one kind."""
    kinds: dict[str, list[Scored]] = {}
    for i in items:
        kinds.setdefault(i.kind or NO_KIND, []).append(i)
    rows = [kind_row(k, v, n_boot, seed) for k, v in kinds.items()]
    if len(kinds) > 1:
        rows.append(kind_row("all", items, n_boot, seed))
    return rows


def verdict(rows: Sequence[KindRow]) -> tuple[str, str]:
    """WARN naming every kind (not the pooled `all`) the head is not shown to route better than random."""
    bad = [r for r in rows if r.verdict == WARN and r.kind != "all"]
    if not bad:
        judged = [r.kind for r in rows if r.verdict == OK and r.kind != "all"]
        return OK, (f"the head routes better than random on {', '.join(judged)}" if judged
                    else "no kind could be judged")
    named = "; ".join(f"{r.kind} ({r.reason})" for r in bad)
    return WARN, f"not better than random on {named}; {FIX}"


def report(items: Sequence[Scored], weak_tier: str, strong_tier: str, n_boot: int = 300) -> dict[str, Any]:
    """The JSON-ready per-kind section of `eval run` (and of `status --check-deps`)."""
    rows = by_kind(items, n_boot)
    v, why = verdict(rows)
    return {"weak_tier": weak_tier, "strong_tier": strong_tier, "rows": [r.as_dict() for r in rows],
            "verdict": v, "reason": why,
            "method": (f"APGR of the route's complexity between tier {weak_tier} (cheapest) and {strong_tier} "
                       "(strongest) from each line's outcomes; random routing 0.5; 95% CI by bootstrap over the "
                       "kind's lines")}
