"""The OpenAI-compatible HTTP front of the router (Starlette). Thin: parse and check the request,
pick the tier (`decide`), consult the response cache (`cache`), call the upstream (`upstreams`),
count (`metrics`), answer. Never a traceback or a silent drop: every failure is an OpenAI error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HTTPRoute

from oculis import RouterConfig, Timeouts, Upstream, Verifier
from oculis_router import answer_check as answers
from oculis_router import cache as rcache
from oculis_router import decide
from oculis_router.decisionlog import DecisionSink
from oculis_router.decisionlog import entry as decision_entry
from oculis_router.errors import APIError, bad_request
from oculis_router.inbound import HeaderLimit, check_body, check_client_key, disconnected, read_body, tenant_of
from oculis_router.limits import identity_of
from oculis_router.limits_store import Hold
from oculis_router.metrics import Metrics
from oculis_router.providers import refusal, relayed_headers
from oculis_router.sse import StreamCollector
from oculis_router.state import ConfigHolder, RouteRuntime, Runtime, describe
from oculis_router.streamcheck import EventGate, MalformedStream
from oculis_router.upstreams import (
    REVISION_HEADER,
    Attempt,
    Caller,
    IdleTimeout,
    Stream,
    UpstreamFailed,
    UpstreamRejected,
)
from oculis_router.usage import Usage, cost_dollars

# Proxies (nginx ingress, CDNs) buffer or cache responses unless told not to; a stream must flow.
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
WATCH_CLIENT_AFTER_S = 0.25  # non-streamed answers slower than this are cancelled if the client leaves
COLD_START_POLL_S = 0.25  # how often a request held by cold_start: wait looks for a reloaded config
log = logging.getLogger("oculis.router")
INTERNAL = APIError(500, "internal router error (logged by the router)", type_="server_error", code="internal")



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


class ColdStartError(APIError):
    """A 503 for a tier whose upstream is scaled to zero (cold_start fail, or wait past its bound), with
    Retry-After and x-oculis-cold-start saying which."""

    def __init__(self, message: str, action: str, retry_after: float, upstream: str) -> None:
        super().__init__(503, message, type_="service_unavailable", code=f"cold_start_{action}")
        self.headers = {"retry-after": str(max(1, round(retry_after))), "x-oculis-cold-start": action,
                        "x-oculis-upstream": upstream}

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return super().response({**self.headers, **(headers or {})})


def _pick(plan: Plan, order: tuple[int, ...], action: str = "") -> Plan:
    """The plan with only the tiers at `order` (positions in its tier list)."""
    return replace(plan, tiers=[plan.tiers[i] for i in order], tier_names=[plan.tier_names[i] for i in order],
                   timeouts=[plan.timeouts[i] for i in order] if plan.timeouts else [],
                   escalated=plan.escalated or (bool(order) and order[0] > 0), cold_start=action or plan.cold_start)


def plan_request(rt: Runtime, body: dict[str, Any], metrics: Metrics, endpoint: str = "chat") -> Plan:
    name = body["model"]
    if name in rt.upstreams:
        return Plan(None, [rt.upstreams[name]], ["direct"], None, False)
    rr = rt.routes.get(name)
    if rr is None:
        # Not the list of names: upstream names are internal (GET /v1/models, behind the same auth, has them).
        raise APIError(404, f"the model {name[:200]!r} does not exist: name a route or upstream of this router "
                       "(GET /v1/models lists them)", param="model", code="model_not_found")
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
    if decision.escalated:
        metrics.escalations.labels(name, "low_confidence").inc()
    check = rr.route.escalation.on_answer
    verifier = rt.upstreams.get(check.verifier.upstream) if check is not None and check.verifier else None
    return Plan(rr, [rt.upstreams[t.upstream] for t in tiers], [t.name for t in tiers], c.complexity,
                decision.escalated, [t.timeouts for t in tiers], c.prompt_tokens, c.confidence, verifier=verifier)


def failure_kind(exc: UpstreamFailed) -> str:
    """A short, bounded label for why a tier failed (`oculis_upstream_failures_total{kind}`)."""
    v = exc.verdict
    if v.credential:
        return "credential"
    if v.context_length:
        return "context_length"
    if v.status == 429:
        return "rate_limited"
    reason = v.reason
    if reason.startswith("status ") and reason[7:10].isdigit():
        return f"status_{reason[7:10]}"
    if "Timeout" in reason or "timed out" in reason or "within" in reason or "stalled" in reason:
        return "timeout"
    if "JSON" in reason or "shape" in reason or "choices" in reason:
        return "bad_answer"
    if "not set in the router's environment" in reason:
        return "missing_key"
    return "connection"


def account(metrics: Metrics, up: Upstream, usage: dict[str, Any] | None, hold: Hold | None = None) -> None:
    u = Usage.parse(usage)
    if hold is not None:  # the limits settle on the same usage the metrics count (one cost, one place)
        hold.record(up.pricing, u)
    if u is None:
        return
    metrics.prompt_tokens.labels(up.name).inc(u.prompt)
    metrics.completion_tokens.labels(up.name).inc(u.completion)
    metrics.cached_tokens.labels(up.name).inc(u.cached)
    metrics.cache_write_tokens.labels(up.name).inc(u.cache_written)
    metrics.cost.labels(up.name).inc(cost_dollars(up.pricing, u))


class Router:
    def __init__(self, holder: ConfigHolder, caller: Caller, metrics: Metrics,
                 client_keys_env: str | None = None) -> None:
        self.holder, self.caller, self.metrics = holder, caller, metrics
        self.client_keys_env = client_keys_env  # from the command line; else the config's server setting
        self.decisions = DecisionSink()

    def logged(self, plan: Plan, body: dict[str, Any], resp: Response) -> Response:
        """The response, after its route's decision log (if any) has its line."""
        cfg = plan.route.route.decision_log if plan.route else None
        if cfg is not None and plan.route is not None:
            self.decisions.write(cfg, decision_entry(cfg, plan.route.route.name, body, plan.complexity,
                                                     plan.confidence, plan.prompt_tokens, resp.status_code,
                                                     resp.headers))
        return resp

    def keys_env(self, rt: Runtime) -> str | None:
        return self.client_keys_env or rt.config.server.client_keys_env

    def headers(self, plan: Plan, i: int, cache: str) -> dict[str, str]:
        h = {"x-oculis-tier": plan.tier_names[i], "x-oculis-upstream": plan.tiers[i].name, "x-oculis-cache": cache,
             "x-oculis-escalated": "true" if plan.escalated or i > 0 else "false"}
        if plan.route:  # a call that names an upstream has no route, and gets no empty header for it
            h["x-oculis-route"] = plan.route.route.name
        if plan.complexity is not None:
            h["x-oculis-complexity"] = f"{plan.complexity:.4f}"
        if plan.cold_start:
            h["x-oculis-cold-start"] = plan.cold_start
        return h

    async def cold_start(self, plan: Plan, route_label: str) -> Plan:
        """Count the demand for the first tier's upstream (it wakes one at zero), then apply the route's
        cold_start to tiers whose upstream is scaled to zero (decide.cold_start)."""
        first = plan.tiers[0]
        self.metrics.upstream_demand.labels(first.name).inc()
        route = plan.route.route if plan.route else None
        cs = decide.cold_start([u.scaled_to_zero for u in plan.tiers], route.cold_start if route else "wait")
        if cs.action == "none":
            return plan if len(cs.order) == len(plan.tiers) else _pick(plan, cs.order)
        if cs.action == "escalated":
            self.metrics.cold_starts.labels(route_label, first.name, "escalated").inc()
            return _pick(plan, cs.order, "escalated")
        wait_s = route.cold_start_wait_seconds if route else 60.0
        if cs.action == "fail":
            self.metrics.cold_starts.labels(route_label, first.name, "failed").inc()
            raise ColdStartError(f"upstream {first.name!r} is scaled to zero and is being woken (route cold_start: "
                                 "fail); retry after Retry-After, or set coldStart: escalate to have the next tier "
                                 "answer meanwhile", "failed", wait_s, first.name)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            await asyncio.sleep(COLD_START_POLL_S)
            up = self.holder.current.upstreams.get(first.name)
            if up is not None and not up.scaled_to_zero:  # the reloaded config says a replica serves
                self.metrics.cold_starts.labels(route_label, first.name, "waited").inc()
                return replace(plan, tiers=[up, *plan.tiers[1:]], cold_start="waited")
        self.metrics.cold_starts.labels(route_label, first.name, "timeout").inc()
        raise ColdStartError(f"upstream {first.name!r} is scaled to zero and no replica served within "
                             f"cold_start_wait_seconds ({wait_s:g} s); it is being woken: retry later, or set "
                             "coldStart: escalate", "timeout", wait_s, first.name)

    async def handle(self, request: Request, endpoint: str) -> Response:
        rt = self.holder.current  # this request's config snapshot, whatever reloads happen meanwhile
        route_label = "-"
        plan: Plan | None = None  # once routed, an error answer still gets its decision-log line
        body: dict[str, Any] = {}
        try:
            check_client_key(request, self.keys_env(rt))
            if self.holder.waiting:
                raise APIError(503, f"no router config loaded yet: waiting for {self.holder.path}; in a cluster it "
                                    "appears once an InferenceRoute exists in this namespace",
                               type_="service_unavailable", code="no_config")
            body = await read_body(request, rt.config.server.max_body_bytes)
            body = check_body(body, endpoint, rt.config.server.max_messages)
            plan = plan_request(rt, body, self.metrics, endpoint)
            route_label = body["model"]
            plan = await self.cold_start(plan, route_label)
            tenant = tenant_of(request)  # the limiter's identity and the cache's partition
            # Admission: after the plan (its prompt count and tiers' prices), before the cache and upstream.
            hold = None if rt.limiter is None else await rt.limiter.admit(
                rt.config.server, plan.route.route if plan.route else None, route_label,
                identity_of(request.headers, tenant), body, plan.prompt_tokens,
                [u.pricing for u in plan.tiers], *self.chains(plan))
            key = None
            if plan.route and plan.route.store and rcache.cacheable(plan.route.route.cache, body):
                key = rcache.cache_key(plan.route.route.cache, body, tenant, plan.tiers[0], endpoint)
                hit = await plan.route.store.get(key)
                self.metrics.cache.labels(route_label, "hit" if hit else "miss").inc()
                if hit is not None:
                    self.metrics.requests.labels(route_label, plan.tier_names[0], plan.tiers[0].name, "cache_hit").inc()
                    hdrs = self.headers(plan, 0, "hit")
                    if hold is not None:  # a hit costs no tokens: only its request counts
                        await hold.settle()
                        hdrs.update(hold.headers)
                    if body.get("stream"):
                        replay = rcache.sse_from_response(hit, endpoint, rcache.stream_wants_usage(body))
                        return self.logged(plan, body, StreamingResponse(
                            _iter(replay), headers={**hdrs, **SSE_HEADERS}, media_type="text/event-stream"))
                    return self.logged(plan, body, JSONResponse(hit, headers=hdrs))
            if body.get("stream"):
                check = plan.route.route.escalation.on_answer if plan.route else None
                if check is not None and check.buffer_streams and plan.route and plan.route.route.escalation.enabled:
                    return self.logged(plan, body, await _held(
                        hold, self._buffered(body, plan, endpoint, key, route_label, hold)))
                return self.logged(plan, body, await _held(
                    hold, self._stream(body, plan, endpoint, key, route_label, hold)))
            return self.logged(plan, body, await self._unless_client_leaves(
                request, _held(hold, self._complete(body, plan, endpoint, key, route_label, hold)), route_label))
        except APIError as err:
            self.metrics.requests.labels(route_label, "-", "-", f"error_{err.status}").inc()
            return err.response() if plan is None else self.logged(plan, body, err.response())
        except ClientDisconnect:  # the client left while sending its body: its doing, not an internal error
            self.metrics.requests.labels(route_label, "-", "-", "client_closed").inc()
            return Response(status_code=499)
        except Exception:
            # Caught here, not by Starlette's handler, which re-raises to uvicorn: that was a second
            # traceback per request and no count. One log record, one error_500, an OpenAI error.
            log.exception("internal error answering %s %s (route %s)", request.method, request.url.path,
                          route_label)
            self.metrics.requests.labels(route_label, "-", "-", "error_500").inc()
            return INTERNAL.response()

    @staticmethod
    def chains(plan: Plan) -> tuple[list[bool], list[answers.Grading | None]]:
        """Per tier: may its answer be replaced by the next one's, and what grading it costs (for the
        limiter's dollar reservation)."""
        route, n = (plan.route.route if plan.route else None), len(plan.tiers)
        graded: list[answers.Grading | None] = []
        for i in range(n):
            v = answers.verifier_for(route, i, n)
            graded.append(None if v is None or plan.verifier is None else answers.Grading.of(v, plan.verifier))
        return [answers.replaceable(route, u, i, n) for i, u in enumerate(plan.tiers)], graded

    async def _grade(self, v: Verifier, plan: Plan, body: dict[str, Any], data: dict[str, Any], endpoint: str,
                     route_label: str, hold: Hold | None) -> int | None:
        """The verifier's score of tier's answer `data` (1-10), or None: no text to grade, the verifier
        failed or gave no score. The answer is then kept: a missing grade is no evidence against it."""
        req = answers.grading_request(v, body, data, endpoint)
        if req is None or plan.verifier is None:
            self.metrics.answer_grades.labels(route_label, v.upstream, "ungraded").inc()
            return None
        up = plan.verifier
        if up.scaled_to_zero:  # woken by this demand (the autoscaler reads it), not waited for: kept ungraded
            self.metrics.upstream_demand.labels(up.name).inc()
            self.metrics.answer_grades.labels(route_label, v.upstream, "cold").inc()
            return None
        try:
            graded = await self.caller.complete(up, "chat", {"model": up.name, **req}, Attempt(can_escalate=False))
        except (UpstreamFailed, UpstreamRejected) as exc:
            kind = failure_kind(exc) if isinstance(exc, UpstreamFailed) else f"rejected_{exc.status}"
            self.metrics.upstream_failures.labels(up.name, kind).inc()
            self.metrics.answer_grades.labels(route_label, v.upstream, "error").inc()
            log.warning("verifier %s could not grade an answer on route %s (kept): %s", up.name, route_label, exc)
            return None
        account(self.metrics, up, graded.get("usage"), hold)  # the grading is billed like any call
        score = answers.score_of(graded)
        outcome = "unscored" if score is None else ("pass" if score >= v.min_score else "fail")
        self.metrics.answer_grades.labels(route_label, v.upstream, outcome).inc()
        if score is None:
            log.warning("verifier %s gave no score 1-10 on route %s (answer kept)", up.name, route_label)
        return score

    def _can_escalate(self, plan: Plan, i: int) -> bool:
        esc = plan.route.route.escalation if plan.route else None
        return bool(esc and esc.enabled and esc.on_upstream_error and i + 1 < len(plan.tiers))

    def _attempt(self, plan: Plan, i: int) -> Attempt:
        """How tier i is called: the route's `escalation.max_retries`, the tier's timeouts, and whether
        a next tier could answer instead."""
        return Attempt(retries=plan.route.route.escalation.max_retries if plan.route else None,
                       timeouts=plan.timeouts[i] if plan.timeouts else None, can_escalate=self._can_escalate(plan, i))

    def _rejected(self, rej: UpstreamRejected, plan: Plan, i: int, key: str | None,
                  route_label: str) -> Response:
        """The upstream refused the request itself: relay its answer, not retried, not escalated."""
        up = plan.tiers[i]
        self.metrics.requests.labels(route_label, plan.tier_names[i], up.name, f"upstream_{rej.status}").inc()
        # Relayed as the upstream answered it: an HTML error page is not labelled JSON.
        ctype = next((v for k, v in rej.headers.items() if k.lower() == "content-type"), "application/json")
        return Response(rej.body, status_code=rej.status, headers={
            **relayed_headers(rej.headers), **self.headers(plan, i, _cache_state(key)), "content-type": ctype})

    def _failed(self, exc: UpstreamFailed, plan: Plan, i: int, route_label: str) -> None:
        """Count a tier that failed after its retries; return to try the next tier, or raise what the
        client gets (a 502, or a 429/503 with the provider's Retry-After)."""
        up = plan.tiers[i]
        # A tier's failure is not the request's outcome (that is counted once, at the end: `ok` after
        # a failover, `error_502` when no tier could answer), so it has its own metric.
        self.metrics.upstream_failures.labels(up.name, failure_kind(exc)).inc()
        last = not self._can_escalate(plan, i)
        if not exc.verdict.credential:  # a refused credential is logged once per upstream, by the caller
            log.warning("%s %s: %s", "no tier left after" if last else "escalating past", up.name, exc)
        if last:
            raise exc.client_error(up.name) from None
        self.metrics.escalations.labels(route_label, "upstream_error").inc()

    async def _unless_client_leaves(self, request: Request, work: Coroutine[Any, Any, Response],
                                    route_label: str) -> Response:
        """Run `work`, but cancel it if the client disconnects first: its upstream call is then closed
        and the engine stops generating an answer nobody will read (a client timing out and
        retrying would otherwise pay for the same tokens twice)."""
        me = asyncio.current_task()
        assert me is not None
        loop = asyncio.get_running_loop()
        left = asyncio.Event()
        watcher: asyncio.Task[None] | None = None

        async def watch() -> None:
            await disconnected(request)
            left.set()
            me.cancel()

        def arm() -> None:
            nonlocal watcher
            watcher = loop.create_task(watch())

        # Watching costs a task and a receive() per request; quick answers finish before it is armed,
        # so the common path pays for one timer only. A disconnect that came earlier is seen at once.
        timer = loop.call_later(WATCH_CLIENT_AFTER_S, arm)
        try:
            return await work
        except asyncio.CancelledError:
            if not left.is_set():
                raise  # cancelled for another reason (shutdown): not ours to swallow
            me.uncancel()
        finally:
            timer.cancel()
            if watcher is not None:
                watcher.cancel()
        self.metrics.requests.labels(route_label, "-", "-", "client_closed").inc()
        return Response(status_code=499)  # nobody reads it; nginx's code for "client closed request"

    async def _complete(self, body: dict[str, Any], plan: Plan, endpoint: str, key: str | None,
                        route_label: str, hold: Hold | None = None) -> Response:
        route = plan.route.route if plan.route else None
        # An answer a check doubted, what the headers say of it, and its tier: sent only if no later tier answers.
        doubted: tuple[JSONResponse, dict[str, str], int] | None = None
        replaced: list[str] = []  # tiers whose answers a later one replaced (x-oculis-replaced-tiers)
        for i, up in enumerate(plan.tiers):
            t0 = time.perf_counter()
            check = answers.check_for(route, up, i, len(plan.tiers))
            verifier = answers.verifier_for(route, i, len(plan.tiers))
            try:
                seen: dict[str, str] = {}  # the upstream's request id and rate-limit headers, for the client
                sent = answers.with_logprobs(body, endpoint) if check else body
                data = await self.caller.complete(up, endpoint, sent, self._attempt(plan, i), headers_out=seen)
            except UpstreamRejected as rej:
                return self._rejected(rej, plan, i, key, route_label)
            except UpstreamFailed as exc:
                try:
                    self._failed(exc, plan, i, route_label)
                except APIError:
                    if doubted is None:
                        raise
                    return self._doubted(doubted, plan, route_label)  # beats none: no later tier answered
                continue
            self.metrics.upstream_latency.labels(up.name).observe(time.perf_counter() - t0)
            # `seen` carries x-oculis-revision (Caller.complete), which the client gets with the answer
            self.metrics.revision_requests.labels(up.name, seen.get(REVISION_HEADER, "stable")).inc()
            account(self.metrics, up, data.get("usage"), hold)  # counted (and billed) even if replaced below
            conf = answers.mean_logprob(data, endpoint) if check else None
            if check and not answers.client_wants_logprobs(body):
                data = answers.without_logprobs(data)
            hdrs = {**seen, **self.headers(plan, i, _cache_state(key))}
            own: dict[str, str] = {}  # what the checks said of this answer
            if conf is not None:
                own["x-oculis-answer-logprob"] = f"{conf:.4f}"
            low = check is not None and check.min_mean_logprob is not None and conf is not None \
                and conf < check.min_mean_logprob
            score = None
            if verifier is not None and not low:  # an answer the logprobs already doubted needs no grading
                score = await self._grade(verifier, plan, body, data, endpoint, route_label, hold)
                if score is not None:
                    own["x-oculis-answer-score"] = str(score)
            hdrs.update({"x-oculis-escalation-reason": "answer", **doubted[1]} if doubted is not None else own)
            if replaced:  # which tiers answered first: the cascade's cost (eval run) needs the whole chain
                hdrs["x-oculis-replaced-tiers"] = ",".join(replaced)
            if low or (verifier is not None and score is not None and score < verifier.min_score):
                reason = answers.LOW_LOGPROB if low else answers.LOW_SCORE
                self.metrics.escalations.labels(route_label, reason).inc()
                doubted = (JSONResponse(data, headers=hdrs), own, i)
                replaced.append(plan.tier_names[i])
                continue
            self.metrics.requests.labels(route_label, plan.tier_names[i], up.name, "ok").inc()
            if key is not None and plan.route and plan.route.store and i == 0 and rcache.storable(endpoint, data):
                await plan.route.store.set(key, data)
            return JSONResponse(data, headers=hdrs)
        if doubted is not None:
            return self._doubted(doubted, plan, route_label)
        raise APIError(502, "no tier could answer", type_="upstream_error", code="upstream_failed")

    def _doubted(self, doubted: tuple[JSONResponse, dict[str, str], int], plan: Plan, route_label: str) -> JSONResponse:
        i = doubted[2]
        self.metrics.requests.labels(route_label, plan.tier_names[i], plan.tiers[i].name, "ok").inc()
        return doubted[0]

    async def _buffered(self, body: dict[str, Any], plan: Plan, endpoint: str, key: str | None,
                        route_label: str, hold: Hold | None = None) -> Response:
        """A stream on a route with escalation.on_answer.buffer_streams: answered whole (checked like a
        non-streamed request), then sent as the stream the client asked for."""
        resp = await self._complete(answers.unbuffered(body), plan, endpoint, key, route_label, hold)
        if resp.status_code != 200 or not isinstance(resp, JSONResponse):
            return resp
        events = rcache.sse_from_response(json.loads(bytes(resp.body)), endpoint, rcache.stream_wants_usage(body))
        hdrs = {k: v for k, v in resp.headers.items() if k not in ("content-length", "content-type")}
        return StreamingResponse(_iter(events), headers={**hdrs, **SSE_HEADERS}, media_type="text/event-stream")

    async def _stream(self, body: dict[str, Any], plan: Plan, endpoint: str, key: str | None,
                      route_label: str, hold: Hold | None = None) -> Response:
        for i, up in enumerate(plan.tiers):
            t0 = time.perf_counter()
            try:
                resp, translator = await self.caller.open_stream(up, endpoint, body, self._attempt(plan, i))
            except UpstreamRejected as rej:
                return self._rejected(rej, plan, i, key, route_label)
            except UpstreamFailed as exc:
                self._failed(exc, plan, i, route_label)
                continue
            self.metrics.revision_requests.labels(up.name, resp.revision).inc()
            store = plan.route.store if (plan.route and key is not None and i == 0) else None
            gen = self._relay(resp, translator, up, t0, route_label, plan.tier_names[i], store, key, endpoint, hold)
            return StreamingResponse(gen, media_type="text/event-stream", headers={
                **relayed_headers(resp.headers), **self.headers(plan, i, _cache_state(key)),
                REVISION_HEADER: resp.revision, **SSE_HEADERS})
        raise APIError(502, "no tier could answer", type_="upstream_error", code="upstream_failed")

    async def _relay(self, resp: Stream, translator: Any, up: Upstream, t0: float, route_label: str,
                     tier: str, store: rcache.Store | None, key: str | None,
                     endpoint: str = "chat", hold: Hold | None = None) -> AsyncIterator[bytes]:
        """Bytes go to the client as they arrive; a copy is parsed on the side for usage and the cache."""
        collector = StreamCollector(endpoint)
        gate = EventGate(up.name)  # whole, well-formed events only, and a stream that ends with [DONE]
        first = True
        outcome = "ok"
        try:
            async for raw in resp:  # each read bounded by the idle timeout (IdleTimeout)
                if first:
                    self.metrics.ttft.labels(up.name).observe(time.perf_counter() - t0)
                    first = False
                chunk = gate.feed(b"".join(translator.feed(raw)) if translator else raw)
                if chunk:
                    collector.feed(chunk)
                    if hold is not None:
                        hold.relayed(chunk)
                    yield chunk
                if gate.failure:
                    raise gate.failure
            if chunk := gate.close():
                collector.feed(chunk)
                yield chunk
            if gate.errored:  # the upstream's own error event reached the client: a failure all the same
                outcome = "stream_broken"
                log.warning("upstream %s sent an error event mid-stream", up.name)
        except Exception as exc:
            # Bytes already reached the client: no retry is possible, so end the stream with an error event.
            # Whatever broke it (the network, a timeout, a malformed or cut stream, a translation that
            # failed on an odd event), the client is told and it is logged once.
            # An AttributeError or TypeError here is the translator meeting an event of a shape it does
            # not know: the upstream's data, so one line with the error, no traceback.
            outcome = "stream_broken"
            ours = isinstance(exc, MalformedStream | IdleTimeout)  # our words; else the client gets only its type
            why = str(exc) if ours else type(exc).__name__
            log.warning("stream from upstream %s broken mid-way: %s", up.name,
                        why if ours else f"{why}: {str(exc)[:200]}")
            err = {"error": {"message": f"upstream {up.name} failed mid-stream: {why}",
                             "type": "upstream_error", "code": "stream_interrupted"}}
            yield b"data: " + json.dumps(err).encode() + b"\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away: counted as such, and the upstream connection is closed below (never
            # pooled half-read), so vLLM aborts the request instead of generating for nobody.
            outcome = "client_closed"
            raise
        finally:
            if outcome != "ok":
                resp.close()
            resp.release()
            self.metrics.upstream_latency.labels(up.name).observe(time.perf_counter() - t0)
            self.metrics.requests.labels(route_label, tier, up.name, outcome).inc()
            account(self.metrics, up, collector.usage, hold)
            if hold is not None:  # a cut stream settles what it used too
                await hold.settle()
        answer = collector.response()  # None unless the stream can stand for the whole answer
        if outcome == "ok" and store is not None and key is not None and answer and rcache.storable(endpoint, answer):
            await store.set(key, answer)


async def _held(hold: Hold | None, work: Coroutine[Any, Any, Response]) -> Response:
    """`work`'s answer with the rate-limit headers; the hold settled once it ends, except a stream's,
    which settles when the stream does (Router._relay)."""
    if hold is None:
        return await work
    try:
        resp = await work
    except BaseException:
        await hold.settle()
        raise
    if not isinstance(resp, StreamingResponse):
        await hold.settle()
    resp.headers.update(hold.headers)
    return resp


def _cache_state(key: str | None) -> str:
    return "bypass" if key is None else "miss"


async def _iter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c


def build_app(config_path: Path | None = None, config: RouterConfig | None = None, metrics: Metrics | None = None,
              reload_interval: float = 1.0, max_retries: int = 2, backoff: float = 0.05,
              wait_for_config: bool = False, client_keys_env: str | None = None,
              endpoints: Path | None = None, redis_url: str | None = None) -> Starlette:
    """`endpoints`: an endpoint map (oculis_router.endpoints) that sends base_url hosts to loopback ports.
    `redis_url`: the response cache and the rate limiter of every config loaded use this Redis."""
    metrics = metrics or Metrics()
    holder = ConfigHolder(config_path, metrics, config, wait_for_file=wait_for_config, redis_url=redis_url)
    # The caller needs the event loop: the lifespan sets it.
    router = Router(holder, None, metrics, client_keys_env)  # type: ignore[arg-type]

    async def chat(request: Request) -> Response:
        return await router.handle(request, "chat")

    async def completions(request: Request) -> Response:
        return await router.handle(request, "completions")

    async def models(request: Request) -> Response:
        try:
            check_client_key(request, router.keys_env(holder.current))
        except APIError as err:
            return err.response()
        return JSONResponse({"object": "list", "data": describe(holder.current)})

    async def model(request: Request) -> Response:
        """`GET /v1/models/{id}` (the SDKs' models.retrieve): the model object, or an OpenAI 404."""
        try:
            check_client_key(request, router.keys_env(holder.current))
            wanted = request.path_params["model_id"]
            found = next((m for m in describe(holder.current) if m["id"] == wanted), None)
            if found is None:
                raise APIError(404, f"the model {wanted!r} does not exist: GET /v1/models lists the routes and "
                               "upstreams", param="model", code="model_not_found")
        except APIError as err:
            return err.response()
        return JSONResponse(found)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openapi_json(request: Request) -> Response:
        from oculis_router.openapi import document

        return JSONResponse(document([m["id"] for m in describe(holder.current)]))

    async def readyz(request: Request) -> Response:
        if holder.waiting:
            return JSONResponse({"status": "waiting for config", "config": str(holder.path)}, status_code=503)
        if holder.watch_stopped:  # serving, but blind to config changes: not a state to stay in unnoticed
            return JSONResponse({"status": f"config reload watcher stopped: {holder.watch_stopped}",
                                 "config": holder.current.digest[:12]}, status_code=503)
        return JSONResponse({"status": "ready", "config": holder.current.digest[:12]})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if endpoints is None:
            connector = aiohttp.TCPConnector(limit=2000, limit_per_host=1000, keepalive_timeout=60)
        else:  # no DNS cache: each new connection asks the map, which follows pods as they come and go
            from oculis_router.endpoints import EndpointResolver

            connector = aiohttp.TCPConnector(limit=2000, limit_per_host=1000, keepalive_timeout=60,
                                             resolver=EndpointResolver(endpoints), use_dns_cache=False)
        http = aiohttp.ClientSession(connector=connector, trust_env=False)
        router.caller = Caller(http, max_retries=max_retries, backoff=backoff)
        watcher = asyncio.create_task(holder.watch(reload_interval)) if config_path else None
        yield
        if watcher:
            watcher.cancel()
        await http.close()
        await holder.close()

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return APIError(status, f"{request.method} {request.url.path}: no such endpoint here "
                        "(POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /v1/models/{id})",
                        code="not_found").response()

    async def internal(request: Request, exc: Exception) -> Response:
        # Only for errors outside Router.handle (which answers its own). Starlette re-raises after this
        # and uvicorn logs the traceback, so it is not logged here too: one record per failure.
        metrics.requests.labels("-", "-", "-", "error_500").inc()
        return INTERNAL.response()

    app = Starlette(exception_handlers={404: not_found, 405: not_found, Exception: internal}, routes=[
        HTTPRoute("/v1/chat/completions", chat, methods=["POST"]),
        HTTPRoute("/v1/completions", completions, methods=["POST"]),
        HTTPRoute("/v1/models", models, methods=["GET"]),
        HTTPRoute("/v1/models/{model_id:path}", model, methods=["GET"]),
        HTTPRoute("/healthz", healthz, methods=["GET"]),
        HTTPRoute("/readyz", readyz, methods=["GET"]),
        HTTPRoute("/openapi.json", openapi_json, methods=["GET"]),
    ], lifespan=lifespan,
        middleware=[Middleware(HeaderLimit, limit=lambda: holder.current.config.server.max_header_bytes)])
    app.state.metrics = metrics
    app.state.holder = holder
    return app
