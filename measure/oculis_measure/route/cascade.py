"""The cost of escalating on the answer (`escalation.on_answer`, seed 003's cascade) next to the
routed-only cost: pure, typed functions, no I/O. `oculis route analyze` and `oculis eval run` report it.

A request routed to tier i costs, routed only, one attempt there. As a cascade it costs

    cascade(i) = attempt(i) + verifier(i) + p_esc(i) x cascade(i + 1),    cascade(last) = attempt(last)

where p_esc(i) is the share of tier i's answers replaced by the next tier's, by either check (the
logprobs' low_answer_confidence or the verifier's low_answer_score; the first answer is paid for all
the same: the router counts and bills it). Every attempt is priced by the router's own formula
(`usage.cost_dollars`, the upstream's `pricing`), with the request's prompt and output tokens at every
tier it reaches.

verifier(i) is the grading of tier i's answer by the route's `escalation.on_answer.verifier`, which
the router calls for every answer of every tier but the last (hosted tiers too). It is priced per
request, at the verifier upstream's `pricing`, as the call the router makes
(`answer_check.grading_request`):

    verifier(i) = cost_dollars(verifier pricing, input = prompt + output + grading_overhead_tokens(v),
                               output = v.max_tokens)

i.e. the conversation and the answer it grades plus the rubric and template (the router's own
estimate), and the verifier's answer at its limit. An upper estimate: the router does not grade an
answer the logprob check already failed, nor one without text, and a score is usually shorter than
max_tokens. A tier with no verifier costs $0 for its check: the logprob check reads the logprobs the
engine returns with its answer and makes no extra call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oculis import Pricing, Route
from oculis.router_upstream import Upstream
from oculis_measure.figures import share
from oculis_router.answer_check import ANSWER_REASONS, SELF_HOSTED, Grading, replaceable, verifier_for
from oculis_router.usage import Usage, cost_dollars

NO_REQUESTS = "no request in the window"

VERIFIER_WHY = ("$0: the logprob check reads the logprobs the engine returns with its answer (no extra call); "
                "the route has no escalation.on_answer.verifier")
DEFAULT_OUTPUT_TOKENS = 256  # an answer's assumed length where none is measured (the online --max-tokens default)
FORMULA = "cascade(i) = attempt(i) + verifier(i) + p_esc(i) x cascade(i+1); routed-only = attempt(routed tier)"


@dataclass(frozen=True)
class Tier:
    name: str
    upstream: str
    pricing: Pricing | None  # None: the upstream is not in the config
    p_esc: float = 0.0  # share of this tier's answers replaced by the next tier's; 0 on the last tier
    grader: Grading | None = None  # the verifier that grades this tier's answers; None: no extra call


@dataclass(frozen=True)
class Request:
    """`count` alike requests routed to tier `tier`, with their prompt and output tokens in total."""

    tier: int
    prompt_tokens: float
    output_tokens: float
    count: float = 1.0
    cached_tokens: float = 0.0  # of prompt_tokens, at the cached price where the upstream has one
    # Per tier, overriding Tier.p_esc: 0 or 1 where the outcome is known (an oracle verifier).
    p_esc: Sequence[float] | None = None


def priced(p: Pricing | None) -> bool:
    """A token price is set (the schema's default is 0, which would price every token at $0)."""
    return p is not None and (p.input_per_mtok > 0 or p.output_per_mtok > 0)


def attempt(t: Tier, r: Request) -> float:
    """One answer from tier t for the request(s), by the router's cost formula."""
    if t.pricing is None:
        return 0.0
    return cost_dollars(t.pricing, Usage(round(r.prompt_tokens), round(r.output_tokens), round(r.cached_tokens), 0))


def grading(t: Tier, r: Request) -> float:
    """verifier(i): the grading of tier t's answer(s) to the request(s): the conversation and the
    answer plus the rubric and template in, max_tokens out, per request (r.count of them)."""
    return 0.0 if t.grader is None else t.grader.cost(r.prompt_tokens, r.output_tokens, r.count)


def p_of(tiers: Sequence[Tier], r: Request, i: int) -> float:
    if i + 1 >= len(tiers):
        return 0.0  # nothing above the last tier to escalate to
    return float(r.p_esc[i]) if r.p_esc is not None else tiers[i].p_esc


def cascade_cost(tiers: Sequence[Tier], r: Request, i: int | None = None) -> float:
    """cascade(i) for the request(s), i defaulting to the routed tier."""
    i = r.tier if i is None else i
    cost = attempt(tiers[i], r)
    p = p_of(tiers, r, i)
    if i + 1 < len(tiers):
        cost += grading(tiers[i], r)
        if p > 0:
            cost += p * cascade_cost(tiers, r, i + 1)
    return cost


def reach(tiers: Sequence[Tier], r: Request) -> list[float]:
    """Expected requests whose final answer comes from each tier."""
    final = [0.0] * len(tiers)
    arriving = r.count
    for i in range(r.tier, len(tiers)):
        p = p_of(tiers, r, i)
        final[i] += arriving * (1 - p)
        arriving *= p
    return final


def graded_cost(tiers: Sequence[Tier], r: Request) -> float:
    """The expected verifier dollars within cascade_cost: each tier's grading, weighted by the share
    of the request(s) that reach it."""
    cost, arriving = 0.0, 1.0
    for i in range(r.tier, len(tiers) - 1):  # the last tier is never graded
        cost += arriving * grading(tiers[i], r)
        arriving *= p_of(tiers, r, i)
    return cost


def verifier_block(tiers: Sequence[Tier], dollars: float, source: str | None = None) -> dict[str, Any]:
    """Which verifier upstream grades which tiers, and what the gradings cost in all; `source` says
    where the grading tokens came from (default: estimated from the requests' tokens)."""
    graders: dict[str, list[str]] = {}
    for t in tiers[:-1]:
        if t.grader is not None:
            graders.setdefault(t.grader.upstream, []).append(t.name)
    if not graders:
        return {"dollars": 0.0, "why": VERIFIER_WHY}
    g = next(t.grader for t in tiers if t.grader is not None)
    who = "; ".join(f"{up} grades {', '.join(names)}" for up, names in graders.items())
    source = source or "estimated from the requests' tokens"
    return {"graders": graders, "dollars": round(dollars, 10), "source": source,
            "why": (f"${dollars:.6g} in the cascade cost: {who} (escalation.on_answer.verifier), one call per answer "
                    "of those tiers at the verifier's pricing: the request's prompt and output tokens plus "
                    f"{g.overhead_tokens} rubric/template tokens in, max_tokens {g.max_tokens} out (an upper "
                    "estimate: the router skips an answer the logprob check already failed, and a score is usually "
                    f"shorter); {source}")}


def _saving(cost: float, strongest: float) -> float | None:
    return round(100 * (1 - cost / strongest), 2) if strongest > 0 else None


def report(tiers: Sequence[Tier], requests: Sequence[Request], p_source: str, tokens: str,
           unchecked: Mapping[str, str] | None = None, verifier_source: str | None = None) -> dict[str, Any]:
    """Per routed tier and in total: routed-only cost, cascade cost (with the verifier's gradings),
    all-strongest cost and savings. `p_source` says where p_esc came from, `tokens` where the token
    counts came from, `unchecked` why a tier below the last gets p_esc 0, `verifier_source` where the
    grading tokens came from."""
    n_tiers, last = len(tiers), len(tiers) - 1
    routed = [0.0] * n_tiers
    final = [0.0] * n_tiers
    only = [0.0] * n_tiers
    casc = [0.0] * n_tiers
    strongest = graded = 0.0
    for r in requests:
        graded += graded_cost(tiers, r)
        routed[r.tier] += r.count
        only[r.tier] += attempt(tiers[r.tier], r)
        casc[r.tier] += cascade_cost(tiers, r)
        strongest += attempt(tiers[last], r)
        final = [a + b for a, b in zip(final, reach(tiers, r), strict=True)]
    total = sum(routed)
    t_only, t_casc = sum(only), sum(casc)
    rows = [{"tier": t.name, "upstream": t.upstream, "priced": priced(t.pricing),
             "p_esc": round(t.p_esc, 4) if i < last else None,
             "routed_requests": round(routed[i], 2), "routed_share": share(routed[i], total, NO_REQUESTS, 4),
             "final_share": share(final[i], total, NO_REQUESTS, 4),
             "routed_only_cost": round(only[i], 10), "cascade_cost": round(casc[i], 10)}
            for i, t in enumerate(tiers)]
    graders = [t.grader for t in tiers[:-1] if t.grader is not None]
    unpriced = sorted({t.upstream for t in tiers if not priced(t.pricing)}
                      | {g.upstream for g in graders if not priced(g.pricing)})
    out: dict[str, Any] = {
        "tiers": rows,
        "total": {"requests": round(total, 2), "routed_only_cost": round(t_only, 10),
                  "cascade_cost": round(t_casc, 10),
                  "cascade_overhead_pct": round(100 * (t_casc / t_only - 1), 2) if t_only > 0 else None},
        "all_strongest": {"tier": tiers[last].name, "upstream": tiers[last].upstream, "cost": round(strongest, 10),
                          "routed_only_saving_pct": _saving(t_only, strongest),
                          "cascade_saving_pct": _saving(t_casc, strongest)},
        "p_esc_source": p_source,
        "unchecked": dict(unchecked or {}),
        "verifier": verifier_block(tiers, graded, verifier_source),
        "tokens": tokens,
        "formula": FORMULA,
        "unpriced": unpriced,
    }
    if unpriced:
        out["unpriced_note"] = (f"no token price for {', '.join(unpriced)}: their tokens count $0 here, so the costs "
                                "and savings leave them out; set pricing: {input_per_mtok, output_per_mtok}")
    return out


def unchecked_reason(route: Route, up: Upstream | None, i: int, what_if: bool) -> str | None:
    """Why the router would not check tier i's answers (None: it would, by the logprob check or the
    verifier, which grades hosted tiers too). `what_if`: as if escalation.on_answer (the logprob check)
    were configured (a rate given by flag for a route without it)."""
    n = len(route.tiers)
    if i + 1 >= n:
        return "the last tier: nothing to escalate to"
    if up is None:
        return f"upstream {route.tiers[i].upstream} is not in the config"
    if not route.escalation.enabled:
        return "escalation.enabled is false"
    if what_if:
        return None if up.provider in SELF_HOSTED else f"{up.provider} is hosted: not asked for logprobs"
    if route.escalation.on_answer is None:
        return "escalation.on_answer is not configured"
    if replaceable(route, up, i, n):
        return None
    return f"{up.provider} is hosted: not asked for logprobs, and the route has no verifier"


def checked_tiers(route: Route, upstreams: Mapping[str, Upstream], what_if: bool) -> set[int]:
    """The indices of the tiers whose answers the router checks (unchecked_reason is None)."""
    return {i for i, t in enumerate(route.tiers)
            if unchecked_reason(route, upstreams.get(t.upstream), i, what_if) is None}


def tiers_for(route: Route, upstreams: Mapping[str, Upstream], p: float | None, what_if: bool
              ) -> tuple[list[Tier], dict[str, str]]:
    """The route's tiers with p_esc = p on each tier the router checks (0 elsewhere), the verifier
    on each tier it grades, and why each other non-last tier is not checked."""
    tiers, why = [], {}
    n = len(route.tiers)
    for i, t in enumerate(route.tiers):
        up = upstreams.get(t.upstream)
        reason = unchecked_reason(route, up, i, what_if)
        if reason is not None and i + 1 < n:
            why[t.name] = reason
        v = verifier_for(route, i, n) if up is not None else None  # no answer from a missing upstream to grade
        grader = None if v is None else Grading.of(v, upstreams.get(v.upstream))
        tiers.append(Tier(t.name, t.upstream, up.pricing if up is not None else None,
                          p if reason is None and p is not None else 0.0, grader))
    return tiers, why


def resolve_rate(route: Route, measured: float | None, measured_what: str, flag: float | None
                 ) -> tuple[float, bool, str]:
    """(p_esc, what_if, where it came from), in order: the measured rate, the flag, else 0."""
    configured = route.escalation.on_answer is not None
    if measured is not None:
        return measured, False, measured_what
    if flag is not None:
        if configured:
            return flag, False, f"--answer-escalation-rate {flag:g}"
        return flag, True, (f"--answer-escalation-rate {flag:g} (what-if: the route has no escalation.on_answer; "
                            "applied to the tiers the router would check)")
    if configured:
        return 0.0, False, ("0: escalation.on_answer is configured but nothing measured its rate here; pass "
                            "--answer-escalation-rate P (0..1)")
    return 0.0, False, "0: escalation.on_answer is not configured (pass --answer-escalation-rate P for a what-if)"


def parse_rate(raw: str) -> float:
    """`--answer-escalation-rate`: a share in [0, 1]; ValueError naming the value and the fix."""
    try:
        v = float(raw)
    except ValueError:
        raise ValueError(f"--answer-escalation-rate {raw!r} is not a number; give a share such as 0.15") from None
    if not 0 <= v <= 1:  # NaN fails this too
        raise ValueError(f"--answer-escalation-rate {raw} is outside 0..1; give a share such as 0.15")
    return v


def parse_output_tokens(n: int) -> int:
    if n < 1:
        raise ValueError(f"--output-tokens {n} must be at least 1; give the typical answer length, e.g. "
                         f"{DEFAULT_OUTPUT_TOKENS}")
    return n


def window_rate(route: Route, checked: set[str], requests: Mapping[tuple[str, str, str, str], float],
                escalations: Mapping[tuple[str, str], float]) -> tuple[float | None, str]:
    """p_esc over a window of the router's counters, pooled over the checked tiers (the escalation
    counter has no tier label): answers replaced / answers those tiers produced, where the answers
    produced are the ones they finally gave plus the ones replaced. Replaced by either check: the
    logprob check's low_answer_confidence and the verifier's low_answer_score. None when they
    produced none."""
    by_reason = {reason: escalations.get((route.name, reason), 0.0) for reason in ANSWER_REASONS}
    replaced = sum(by_reason.values())
    kept = sum(v for (r, tier, _, outcome), v in requests.items()
               if r == route.name and tier in checked and outcome == "ok")
    produced = kept + replaced
    if produced <= 0:
        return None, ""
    reasons = ", ".join(f"{k} {v:g}" for k, v in by_reason.items())
    return min(replaced / produced, 1.0), (
        f"the window: oculis_escalations_total{{reason=~\"{'|'.join(ANSWER_REASONS)}\"}} {replaced:g} answers "
        f"replaced ({reasons}; both checks count) / {produced:g} answers of the checked tiers "
        f"({', '.join(sorted(checked))}; pooled: the counter has no tier label)")
