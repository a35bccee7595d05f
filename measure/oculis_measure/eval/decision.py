"""Does routing pay on this suite? The cost at matched quality of each alternative, and a verdict.

From a suite's offline rows (each prompt's complexity, the cheapest and the strongest tier's outcomes, the
configured route's tier, the cost of an answer from each): the route as configured, all-weak, all-strong,
the complexity threshold that reaches the strong model's accuracy within the tolerance (the smallest share
of strong calls that does, highest complexity first), and the cascade where an answer check is configured.
Verdict: ROUTING PAYS (the threshold's saving against all-strong, with a bootstrap interval) when APGR's
interval lies above 0.5; ROUTING DOES NOT PAY ON THIS SUITE when it includes 0.5 (or the cheapest tier alone
is within the tolerance); TOO FEW ROWS below MIN_ROWS; CANNOT JUDGE when the suite cannot say (one model
twice, outcomes all one value). Pure: no I/O, numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from oculis_router import head_fit

PAYS, DOES_NOT_PAY, TOO_FEW, CANNOT = "ROUTING PAYS", "ROUTING DOES NOT PAY ON THIS SUITE", "TOO FEW ROWS", \
    "CANNOT JUDGE"
MIN_ROWS = 50  # random routing's APGR has sd ~0.07 at 72 prompts: fewer cannot tell a head from a coin


@dataclass(frozen=True)
class Row:
    complexity: float
    weak: bool  # the cheapest tier's outcome
    strong: bool  # the strongest tier's outcome
    routed: bool  # the outcome of the tier the route chose
    cost_weak: float  # $ of this prompt's answer from the cheapest tier
    cost_strong: float
    cost_routed: float
    kind: str | None = None


def absent(reason: str) -> dict[str, Any]:
    """A figure the suite cannot give: shown as `-` with its reason, never as a number.
    (Local until the shared figures helper lands; one place to point at it.)"""
    return {"value": None, "reason": reason}


def threshold_share(score: np.ndarray, weak: np.ndarray, strong: np.ndarray, target: float) -> float | None:
    """The smallest share of strong calls (highest score first) whose accuracy reaches `target`; None if none."""
    order = np.argsort(-score, kind="stable")
    n = len(score)
    acc = (weak.sum() + np.concatenate([[0.0], np.cumsum((strong.astype(float) - weak)[order])])) / n
    hit = np.nonzero(acc >= target - 1e-12)[0]
    return float(hit[0] / n) if len(hit) else None


def _threshold_cost(score: np.ndarray, weak: np.ndarray, strong: np.ndarray, cw: np.ndarray, cs: np.ndarray,
                    tol: float) -> tuple[float | None, float | None, float | None]:
    """(share of strong calls, accuracy, cost) of the matched threshold."""
    share = threshold_share(score, weak, strong, float(strong.mean()) - tol)
    if share is None:
        return None, None, None
    k = round(share * len(score))
    up = np.zeros(len(score), bool)
    up[np.argsort(-score, kind="stable")[:k]] = True
    return share, float(np.where(up, strong, weak).mean()), float(np.where(up, cs, cw).sum())


def _verdict_line(v: str, why: str) -> dict[str, Any]:
    return {"verdict": v, "line": f"{v}: {why}"}


def decide(rows: Sequence[Row], tolerance_pp: float, same_model: str | None = None,
           cascade: tuple[float, float] | None = None, n_boot: int = 300, seed: int = 0) -> dict[str, Any]:
    """The alternatives' accuracy and cost, and the verdict. `same_model`: the model name when the cheapest
    and the strongest tier are one model; `cascade`: (accuracy, cost) where an answer check is configured."""
    n = len(rows)
    tol = tolerance_pp / 100
    out: dict[str, Any] = {"rows": n, "tolerance_pp": tolerance_pp, "alternatives": [], "apgr": None,
                           "apgr_ci": None, "saving": None, "saving_ci": None, "caveats": []}
    if same_model is not None:
        return out | _verdict_line(CANNOT, f"the cheapest and the strongest tier are the same model ({same_model}): "
                                           "there is no cheaper choice to route to")
    if n == 0:
        return out | _verdict_line(TOO_FEW, "no row has outcomes of both the cheapest and the strongest tier")
    w = np.array([r.weak for r in rows], float)
    s = np.array([r.strong for r in rows], float)
    score = np.array([r.complexity for r in rows], float)
    cw = np.array([r.cost_weak for r in rows], float)
    cs = np.array([r.cost_strong for r in rows], float)
    priced = bool(cs.sum() > 0)
    if not priced:  # no prices: a strong call is the unit of cost
        cw, cs = np.zeros(n), np.ones(n)
        out["caveats"].append("no upstream prices in the config: cost is counted in strong calls")
    cr = np.array([r.cost_routed for r in rows], float) if priced else np.array(
        [float(r.routed == r.strong and r.routed != r.weak) for r in rows])
    share, acc, cost = _threshold_cost(score, w, s, cw, cs, tol)
    alts = [("route as configured", float(np.mean([r.routed for r in rows])), float(cr.sum()), None),
            ("all-weak", float(w.mean()), float(cw.sum()), 0.0),
            ("all-strong", float(s.mean()), float(cs.sum()), 1.0),
            ("threshold at strong accuracy - tolerance", acc, cost, share)]
    if cascade is not None:
        alts.append(("cascade (answer check)", cascade[0], cascade[1], None))
    out["alternatives"] = [{"name": a, "accuracy": None if ac is None else round(ac, 4),
                            "cost": None if c is None else round(c, 6),
                            "strong_share": None if sh is None else round(sh, 4)} for a, ac, c, sh in alts]
    out["cost_unit"] = "$" if priced else "strong calls"
    kinds = {r.kind for r in rows}
    if len(kinds) == 1:
        out["caveats"].append(f"one kind only ({next(iter(kinds)) or 'no kind given'}): the verdict is about this "
                              "traffic, not about kinds the suite lacks")
    if len({*w.tolist(), *s.tolist()}) == 1:
        return out | _verdict_line(CANNOT, f"every outcome of both tiers is {bool(w[0])}: the suite cannot tell the "
                                           "tiers apart")
    if n < MIN_ROWS:
        return out | _verdict_line(TOO_FEW, f"{n} rows with both tiers' outcomes; the APGR interval needs "
                                            f"{MIN_ROWS}+ to tell routing from a coin")
    if w.mean() >= s.mean() - tol:
        return out | _verdict_line(DOES_NOT_PAY, f"the cheapest tier alone is within {tolerance_pp:g} pp of the "
                                                 f"strongest ({w.mean():.3f} vs {s.mean():.3f}): use a static route "
                                                 "to it")
    a = head_fit.apgr(score, w, s, seed)
    lo, hi = head_fit.bootstrap({"r": score}, w, s, n_boot, seed)["r"]
    out["apgr"], out["apgr_ci"] = round(a, 4), [round(lo, 4), round(hi, 4)]
    if not lo > 0.5:
        return out | _verdict_line(DOES_NOT_PAY, f"APGR {a:.3f}, 95% CI [{lo:.3f}, {hi:.3f}] includes 0.5: use a "
                                                 "static route or a cascade")
    rng = np.random.default_rng(seed)
    savings = []
    for _ in range(n_boot):
        i = rng.integers(0, n, n)
        _, _, c = _threshold_cost(score[i], w[i], s[i], cw[i], cs[i], tol)
        if c is not None and cs[i].sum() > 0:
            savings.append(1 - c / cs[i].sum())
    saving = 1 - (cost if cost is not None else cs.sum()) / cs.sum()
    out["saving"] = round(saving, 4)
    if savings:
        out["saving_ci"] = [round(float(np.percentile(savings, 2.5)), 4), round(float(np.percentile(savings, 97.5)), 4)]
    ci = out["saving_ci"]
    shown = f", 95% CI [{ci[0]:.1%}, {ci[1]:.1%}]" if ci else ""
    return out | _verdict_line(PAYS, f"the threshold at the strong model's accuracy - {tolerance_pp:g} pp costs "
                                     f"{saving:.1%} less than all-strong{shown} (APGR {a:.3f}, 95% CI "
                                     f"[{lo:.3f}, {hi:.3f}])")
