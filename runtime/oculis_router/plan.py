"""Step 1 of the request path (plan -> pick -> call -> relay): which tiers a request will try, in
order, settled before any upstream is called. The route's classifier orders the tiers (`decide`),
tiers that cannot take the request are skipped, and the route's cold_start handles tiers whose
upstream is scaled to zero. The headers that tell the client what was decided are built here too.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Any

from oculis import Timeouts, Upstream
from oculis_router import adapters, decide
from oculis_router import answer_check as answers
from oculis_router.errors import APIError, bad_request
from oculis_router.metrics import Metrics
from oculis_router.providers import refusal
from oculis_router.state import ConfigHolder, RouteRuntime, Runtime

COLD_START_POLL_S = 0.25  # how often a request held by cold_start: wait looks for a reloaded config


@dataclass
class Plan:
    """What one request will do, settled before any upstream is called."""

    route: RouteRuntime | None
    tiers: list[Upstream]  # the upstream to try first, then the ones to escalate to
    tier_names: list[str]
    complexity: float | None
    escalated: bool
    timeouts: list[Timeouts | None] = field(default_factory=list)  # per tier: overrides of its upstream's
    prompt_tokens: int | None = None  # the classifier's count (None: not classified), for rate limits
    confidence: float | None = None  # the classifier's (None: not classified), for the decision log
    cold_start: str = ""  # what the route's cold_start did (x-oculis-cold-start): escalated or waited
    verifier: Upstream | None = None  # the route's escalation.on_answer.verifier upstream, if any
    why: str = ""  # why the first tier is above the one the prompt matched: low_confidence or cold_start
    # Filled in as the tiers are called (call.py): the positions tried, in order, and why the request
    # moved past each but the last (ESCALATED_ON_FAILURE, ESCALATED_ON_ANSWER): headers, decision log,
    # and the labels of a request whose client left mid-call.
    tried: list[int] = field(default_factory=list)
    moved: list[str] = field(default_factory=list)
    cold_skipped: list[str] = field(default_factory=list)  # later tiers' upstreams left out: scaled to zero
    failures: list[str] = field(default_factory=list)  # "tier (upstream): why" of each tier that failed, in order
    adapters: list[str | None] = field(default_factory=list)  # per tier: the LoRA adapter asked for (None: base)

    def routed_tier(self) -> str | None:
        """The tier the request was first sent to (None: no tier)."""
        at = self.tried[0] if self.tried else 0
        return self.tier_names[at] if at < len(self.tier_names) else None

    def trying(self) -> tuple[str, str]:
        """(tier, upstream) of the tier being called (or last called), or ("-", "-") before any."""
        if not self.tried:
            return "-", "-"
        return self.tier_names[self.tried[-1]], self.tiers[self.tried[-1]].name


ESCALATED_ON_FAILURE = "upstream_error"  # the tier failed (after its retries): the next one was tried
ESCALATED_ON_ANSWER = "answer"  # the tier's answer was doubted (escalation.on_answer) and replaced


class ColdStartError(APIError):
    """A 503 for a tier whose upstream is scaled to zero (cold_start fail, or wait past its bound), with
    Retry-After and x-oculis-cold-start saying which."""

    def __init__(self, message: str, action: str, retry_after: float, upstream: str) -> None:
        super().__init__(503, message, type_="service_unavailable", code=f"cold_start_{action}", headers={
            "retry-after": str(max(1, round(retry_after))), "x-oculis-cold-start": action,
            "x-oculis-upstream": upstream})


def narrowed(plan: Plan, order: tuple[int, ...], action: str = "") -> Plan:
    """The plan with only the tiers at `order` (positions in its tier list)."""
    moved_up = bool(order) and order[0] > 0
    return replace(plan, tiers=[plan.tiers[i] for i in order], tier_names=[plan.tier_names[i] for i in order],
                   timeouts=[plan.timeouts[i] for i in order] if plan.timeouts else [],
                   adapters=[plan.adapters[i] for i in order] if plan.adapters else [],
                   escalated=plan.escalated or moved_up, cold_start=action or plan.cold_start,
                   why="cold_start" if moved_up and action == "escalated" else plan.why)


def adapter_plan(rt: Runtime, model: str, base: str, adapter: str, metrics: Metrics) -> Plan:
    """`model: <upstream>/<adapter>` (that upstream alone) or `<route>/<adapter>` (the route's tiers whose
    upstream serves the adapter, cheapest first, escalating along them; unclassified: the adapter fixes the
    model); an adapter they do not serve is a 404 naming the ones they do."""
    if base in rt.upstreams:
        up = rt.upstreams[base]
        if adapter not in (up.adapters or []):
            raise adapters.unknown(model, adapter, up.adapters or [])
        metrics.routed.labels(base, "direct", base).inc()
        metrics.adapter_requests.labels(base, base, adapter).inc()
        return Plan(None, [adapters.with_adapter(up, adapter)], ["direct"], None, False, adapters=[adapter])
    rr = rt.routes[base]
    tiers = [rr.route.tiers[i] for i in adapters.tiers_for(rt, rr, adapter)]
    if not tiers:
        raise adapters.unknown(model, adapter, adapters.route_adapters(rt, rr))
    metrics.routed.labels(base, tiers[0].name, tiers[0].upstream).inc()
    metrics.adapter_requests.labels(base, tiers[0].upstream, adapter).inc()
    return Plan(rr, [adapters.with_adapter(rt.upstreams[t.upstream], adapter) for t in tiers], [t.name for t in tiers],
                None, False, [t.timeouts for t in tiers], adapters=[adapter] * len(tiers))


def plan_request(rt: Runtime, body: dict[str, Any], metrics: Metrics, endpoint: str = "chat") -> Plan:
    name = body["model"]
    if name not in rt.upstreams and name not in rt.routes and (named := adapters.split(rt, name)):
        return adapter_plan(rt, name, *named, metrics)
    if name in rt.upstreams:
        metrics.routed.labels(name, "direct", name).inc()
        return Plan(None, [rt.upstreams[name]], ["direct"], None, False)
    rr = rt.routes.get(name)
    if rr is None:
        # Not the list of names: upstream names are internal (GET /v1/models, behind the same auth, has them).
        raise APIError(404, f"the model {name[:200]!r} does not exist: name a route or upstream of this router "
                       "(GET /v1/models lists them)", param="model", code="model_not_found")
    check = rr.route.escalation.on_answer
    if body.get("n", 1) > 1 and check is not None and rr.route.escalation.enabled:
        # Passed through elsewhere (vLLM and OpenAI answer n choices); a checked answer is judged, and
        # replaced, as one choice.
        raise bad_request(f"route {name!r} checks each answer (escalation.on_answer), one choice at a time: `n` "
                          "must be 1 on it; send separate requests, or use a route without on_answer", param="n",
                          code="unsupported_parameter")
    t0 = time.perf_counter()
    try:
        # A tier whose upstream cannot take this request (Anthropic: no /v1/completions, a field it cannot
        # translate) is skipped like one without the prompt's modality (decide.tier_order).
        skip = {t.upstream: why for t in rr.route.tiers
                if (why := refusal(rt.upstreams[t.upstream], endpoint, body)) is not None}
        c, decision = rr.scorer.score(body, skip)
    except ValueError as exc:
        raise bad_request(str(exc), param="messages") from None
    metrics.classification.labels(name).observe(time.perf_counter() - t0)
    if not decision.order:
        why = skip.get(decision.tier.upstream) or next(iter(skip.values()))
        raise APIError(why.status, f"route {name!r} has no tier that can take this request: {why.message}",
                       param=why.param, code=why.code)
    tiers = [rr.route.tiers[i] for i in decision.order]
    metrics.routed.labels(name, tiers[0].name, tiers[0].upstream).inc()
    if decision.escalated:
        metrics.escalations.labels(name, "low_confidence").inc()
    verifier = rt.upstreams.get(check.verifier.upstream) if check is not None and check.verifier else None
    if tiers[0].adapter is not None:
        metrics.adapter_requests.labels(name, tiers[0].upstream, tiers[0].adapter).inc()
    return Plan(rr, [adapters.with_adapter(rt.upstreams[t.upstream], t.adapter) for t in tiers],
                [t.name for t in tiers], c.complexity, decision.escalated, [t.timeouts for t in tiers],
                c.prompt_tokens, c.confidence, verifier=verifier, why="low_confidence" if decision.escalated else "",
                adapters=[t.adapter for t in tiers])


def cold_start_advice(mode: str | None, later_serving: bool) -> str:
    """What a client held back by a cold start is told to do, never to set the setting in force: `mode` is
    the route's cold_start (None: the request named an upstream, no route); `later_serving`: a later
    tier of the plan has a replica."""
    if mode is None:
        return "retry after Retry-After (a request naming an upstream waits for it; name a route to have " \
               "another tier answer meanwhile)"
    if mode == "escalate":  # it fell back to waiting: no later tier serves
        return "retry after Retry-After (cold_start: escalate had no later tier with a replica to answer " \
               "meanwhile, so the request waited)"
    if later_serving:
        return "retry after Retry-After, or set the route's cold_start: escalate (InferenceRoute coldStart) to " \
               "have the next tier answer meanwhile"
    return "retry after Retry-After (no later tier of the route has a replica to answer meanwhile)"


async def cold_start(plan: Plan, route_label: str, holder: ConfigHolder, metrics: Metrics) -> Plan:
    """Count the demand for the first tier's upstream (it wakes one at zero), then apply the route's
    cold_start to tiers whose upstream is scaled to zero (decide.cold_start)."""
    first = plan.tiers[0]
    metrics.upstream_demand.labels(first.name).inc()
    route = plan.route.route if plan.route else None
    cs = decide.cold_start([u.scaled_to_zero for u in plan.tiers], route.cold_start if route else "wait")
    if cs.action == "none":
        if len(cs.order) == len(plan.tiers):
            return plan
        # Later tiers at zero are left out (their call could only fail to connect); should the tiers
        # that serve fail, the client is told they were skipped and they are woken (call.Calls.failed).
        return replace(narrowed(plan, cs.order), cold_skipped=[u.name for i, u in enumerate(plan.tiers)
                                                               if i not in cs.order])
    if cs.action == "escalated":
        metrics.cold_starts.labels(route_label, first.name, "escalated").inc()
        return narrowed(plan, cs.order, "escalated")
    wait_s = route.cold_start_wait_seconds if route else 60.0
    advice = cold_start_advice(route.cold_start if route else None,
                               any(not u.scaled_to_zero for u in plan.tiers[1:]))
    if cs.action == "fail":
        metrics.cold_starts.labels(route_label, first.name, "failed").inc()
        raise ColdStartError(f"upstream {first.name!r} is scaled to zero and is being woken (route cold_start: "
                             f"fail); {advice}", "failed", wait_s, first.name)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        await asyncio.sleep(COLD_START_POLL_S)
        up = holder.current.upstreams.get(first.name)
        if up is not None and not up.scaled_to_zero:  # the reloaded config says a replica serves
            metrics.cold_starts.labels(route_label, first.name, "waited").inc()
            return replace(plan, tiers=[up, *plan.tiers[1:]], cold_start="waited")
    metrics.cold_starts.labels(route_label, first.name, "timeout").inc()
    raise ColdStartError(f"upstream {first.name!r} is scaled to zero and no replica served within "
                         f"cold_start_wait_seconds ({wait_s:g} s); it is being woken: {advice}", "timeout", wait_s,
                         first.name)


def chains(plan: Plan) -> tuple[list[bool], list[answers.Grading | None]]:
    """Per tier: may its answer be replaced by the next one's, and what grading it costs (for the
    limiter's dollar reservation)."""
    route, n = (plan.route.route if plan.route else None), len(plan.tiers)
    graded: list[answers.Grading | None] = []
    for i in range(n):
        v = answers.verifier_for(route, i, n)
        graded.append(None if v is None or plan.verifier is None else answers.Grading.of(v, plan.verifier))
    return [answers.replaceable(route, u, i, n) for i, u in enumerate(plan.tiers)], graded


def headers(plan: Plan, i: int, cache: str | None) -> dict[str, str]:
    """What the client is told of the decision when tier i answers (cache: hit, miss or bypass; None for
    an error): the tier, why the request was escalated (the latest reason), and the tiers that failed or
    whose answers were replaced before it."""
    h = {"x-oculis-tier": plan.tier_names[i], "x-oculis-upstream": plan.tiers[i].name,
         "x-oculis-escalated": "true" if plan.escalated or i > 0 else "false"}
    if cache is not None:
        h["x-oculis-cache"] = cache
    if i < len(plan.adapters) and plan.adapters[i] is not None:
        h[adapters.HEADER] = str(plan.adapters[i])
    reasons = ([plan.why] if plan.why else []) + plan.moved
    if h["x-oculis-escalated"] == "true" and reasons:
        h["x-oculis-escalation-reason"] = reasons[-1]
    # in order: the cascade's cost (eval run) needs the whole chain
    for name, why in (("x-oculis-failed-tiers", ESCALATED_ON_FAILURE),
                      ("x-oculis-replaced-tiers", ESCALATED_ON_ANSWER)):
        if passed := [plan.tier_names[t] for t, m in zip(plan.tried, plan.moved, strict=False) if m == why]:
            h[name] = ",".join(passed)
    if plan.route:  # a call that names an upstream has no route, and gets no empty header for it
        h["x-oculis-route"] = plan.route.route.name
    if plan.complexity is not None:
        h["x-oculis-complexity"] = f"{plan.complexity:.4f}"
    if plan.cold_start:
        h["x-oculis-cold-start"] = plan.cold_start
    return h


def cache_state(key: str | None) -> str:
    """x-oculis-cache of an answer that did not come from the cache."""
    return "bypass" if key is None else "miss"
