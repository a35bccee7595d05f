"""Step 3 of the request path (plan -> pick -> call -> relay): each tier of the plan is called in
turn until one answers. A tier that fails after its retries escalates to the next (when the route
allows it); a tier's refusal of the request itself (a 4xx) is relayed as is; an answer a check
doubts (low logprobs, a verifier's low grade) is replaced by a later tier's, or sent if none answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from oculis import Verifier
from oculis_router import answer_check as answers
from oculis_router import cache as rcache
from oculis_router.errors import APIError
from oculis_router.limits_store import Hold
from oculis_router.metrics import Metrics
from oculis_router.plan import ESCALATED_ON_ANSWER, ESCALATED_ON_FAILURE, Plan, cache_state
from oculis_router.plan import headers as plan_headers
from oculis_router.providers import relayed_headers
from oculis_router.relay import SSE_HEADERS, account, estimate_of, estimated_usage, relay, replay
from oculis_router.revisions import REPLICA_HEADER, REVISION_HEADER
from oculis_router.upstreams import Attempt, Caller
from oculis_router.verdicts import UpstreamFailed, UpstreamRejected, failure_kind

log = logging.getLogger("oculis.router")


class Calls:
    """The calls of one router: its upstream caller (set once the event loop runs) and its metrics."""

    def __init__(self, caller: Caller | None, metrics: Metrics) -> None:
        self.caller: Caller = caller  # type: ignore[assignment]  # the app's lifespan sets it
        self.metrics = metrics
        self.no_logprobs_said: set[str] = set()  # upstreams already reported as answering without logprobs

    def count_logprob_check(self, route_label: str, upstream: str, conf: float | None, low: bool) -> None:
        """Every answer the logprob check saw, by outcome; one without logprobs could not be checked (an engine
        that drops them silently disabled escalation.on_answer.min_mean_logprob): counted, and said once."""
        outcome = "no_logprobs" if conf is None else "fail" if low else "pass"
        self.metrics.answer_logprob_checks.labels(route_label, upstream, outcome).inc()
        if conf is None and upstream not in self.no_logprobs_said:
            self.no_logprobs_said.add(upstream)
            log.warning("upstream %s answered without logprobs on route %s: its answers cannot be checked "
                        "against min_mean_logprob (kept); counted as oculis_answer_logprob_checks_total"
                        "{outcome=\"no_logprobs\"}", upstream, route_label)

    async def grade(self, v: Verifier, plan: Plan, body: dict[str, Any], data: dict[str, Any], endpoint: str,
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
            kind = failure_kind(exc.verdict) if isinstance(exc, UpstreamFailed) else f"rejected_{exc.status}"
            self.metrics.upstream_failures.labels(up.name, kind, "stable").inc()
            self.metrics.answer_grades.labels(route_label, v.upstream, "error").inc()
            log.warning("verifier %s could not grade an answer on route %s (kept): %s", up.name, route_label, exc)
            return None
        # the grading is billed like any call, estimated from its text when it reports no usage
        account(self.metrics, up, graded.get("usage"), hold, estimate_of(req, None, graded, "chat"))
        score = answers.score_of(graded)
        outcome = "unscored" if score is None else ("pass" if score >= v.min_score else "fail")
        self.metrics.answer_grades.labels(route_label, v.upstream, outcome).inc()
        if score is None:
            log.warning("verifier %s gave no score 1-10 on route %s (answer kept)", up.name, route_label)
        return score

    def can_escalate(self, plan: Plan, i: int) -> bool:
        esc = plan.route.route.escalation if plan.route else None
        return bool(esc and esc.enabled and esc.on_upstream_error and i + 1 < len(plan.tiers))

    def attempt(self, plan: Plan, i: int) -> Attempt:
        """How tier i is called: the route's `escalation.max_retries`, the tier's timeouts, and whether
        a next tier could answer instead."""
        return Attempt(retries=plan.route.route.escalation.max_retries if plan.route else None,
                       timeouts=plan.timeouts[i] if plan.timeouts else None, can_escalate=self.can_escalate(plan, i))

    def rejected(self, rej: UpstreamRejected, plan: Plan, i: int, key: str | None,
                  route_label: str) -> Response:
        """The upstream refused the request itself: relay its answer, not retried, not escalated."""
        up = plan.tiers[i]
        self.metrics.requests.labels(route_label, plan.tier_names[i], up.name, f"upstream_{rej.status}").inc()
        # Relayed as the upstream answered it: an HTML error page is not labelled JSON.
        ctype = next((v for k, v in rej.headers.items() if k.lower() == "content-type"), "application/json")
        return Response(rej.body, status_code=rej.status, headers={
            **relayed_headers(rej.headers), **plan_headers(plan, i, cache_state(key)), "content-type": ctype})

    def failed(self, exc: UpstreamFailed, plan: Plan, i: int, route_label: str) -> None:
        """Count a tier that failed after its retries; return to try the next tier, or raise what the
        client gets (a 502, or a 429/503 with the provider's Retry-After)."""
        up = plan.tiers[i]
        # A tier's failure is not the request's outcome (that is counted once, at the end: `ok` after
        # a failover, `error_502` when no tier could answer), so it has its own metric.
        self.metrics.upstream_failures.labels(up.name, failure_kind(exc.verdict), "stable").inc()
        last = not self.can_escalate(plan, i)
        if not exc.verdict.credential:  # a refused credential is logged once per upstream, by the caller
            log.warning("%s %s: %s", "no tier left after" if last else "escalating past", up.name, exc)
        if last:
            err = exc.client_error(up.name)
            if plan.failures:  # each tier's cause, not only the last one's (QA3 Part 2 #12)
                err.message += f"; before it: {'; '.join(plan.failures)}"
            err.headers.update(plan_headers(plan, i, None))  # which tier failed last, and those before it
            esc = plan.route.route.escalation if plan.route else None
            if plan.cold_skipped and esc and esc.enabled and esc.on_upstream_error:
                # A later tier would have answered but is at zero: wake it, and say when to come back.
                for name in plan.cold_skipped:
                    self.metrics.upstream_demand.labels(name).inc()
                after = max(1, round(plan.route.route.cold_start_wait_seconds if plan.route else 60.0),
                            int(err.headers.get("retry-after", "0")))
                err.message += (f"; the route's later tiers on {', '.join(plan.cold_skipped)} are scaled to zero "
                                "and were skipped: they are being woken, retry after Retry-After")
                err.headers.update({"x-oculis-cold-start": "skipped", "retry-after": str(after)})
            raise err from None
        plan.failures.append(f"{plan.tier_names[i]} ({up.name}): {str(exc).removeprefix(f'{up.name}: ')}")
        plan.moved.append(ESCALATED_ON_FAILURE)
        self.metrics.escalations.labels(route_label, ESCALATED_ON_FAILURE).inc()

    async def complete(self, body: dict[str, Any], plan: Plan, endpoint: str, key: str | None,
                        route_label: str, hold: Hold | None = None) -> Response:
        route = plan.route.route if plan.route else None
        # An answer a check doubted, what the headers say of it, and its tier: sent only if no later tier answers.
        doubted: tuple[JSONResponse, dict[str, str], int] | None = None
        for i, up in enumerate(plan.tiers):
            plan.tried.append(i)
            t0 = time.perf_counter()
            check = answers.check_for(route, up, i, len(plan.tiers))
            verifier = answers.verifier_for(route, i, len(plan.tiers))
            try:
                seen: dict[str, str] = {}  # the upstream's request id and rate-limit headers, for the client
                sent = answers.with_logprobs(body, endpoint) if check else body
                data = await self.caller.complete(up, endpoint, sent, self.attempt(plan, i), headers_out=seen)
            except asyncio.CancelledError:  # the client left (app.unless_client_leaves): the prompt was read
                account(self.metrics, up, None, hold, lambda: estimated_usage(body, plan.prompt_tokens, ""),
                        "client_closed")
                raise
            except UpstreamRejected as rej:
                return self.rejected(rej, plan, i, key, route_label)
            except UpstreamFailed as exc:
                try:
                    self.failed(exc, plan, i, route_label)
                except APIError:
                    if doubted is None:
                        raise
                    return self.doubted(doubted, plan, route_label)  # beats none: no later tier answered
                continue
            self.metrics.upstream_latency.labels(up.name).observe(time.perf_counter() - t0)
            # `seen` carries x-oculis-revision (Caller.complete), which the client gets with the answer
            self.metrics.revision_requests.labels(up.name, seen.get(REVISION_HEADER, "stable")).inc()
            # counted (and billed) even if replaced below; an answer without usage by its text
            account(self.metrics, up, data.get("usage"), hold, estimate_of(body, plan.prompt_tokens, data, endpoint))
            conf = answers.mean_logprob(data, endpoint) if check else None
            if check and not answers.client_wants_logprobs(body):
                data = answers.without_logprobs(data)
            hdrs = {**seen, **plan_headers(plan, i, cache_state(key))}
            own: dict[str, str] = {}  # what the checks said of this answer
            if conf is not None:
                own["x-oculis-answer-logprob"] = f"{conf:.4f}"
            low = check is not None and check.min_mean_logprob is not None and conf is not None \
                and conf < check.min_mean_logprob
            if check is not None:
                self.count_logprob_check(route_label, up.name, conf, low)
            score = None
            if verifier is not None and not low:  # an answer the logprobs already doubted needs no grading
                score = await self.grade(verifier, plan, body, data, endpoint, route_label, hold)
                if score is not None:
                    own["x-oculis-answer-score"] = str(score)
            hdrs.update(doubted[1] if doubted is not None else own)  # a replacement: what doubted the first
            if low or (verifier is not None and score is not None and score < verifier.min_score):
                reason = answers.LOW_LOGPROB if low else answers.LOW_SCORE
                self.metrics.escalations.labels(route_label, reason).inc()
                self.metrics.answers_replaced.labels(route_label, plan.tier_names[i], up.name, reason).inc()
                doubted = (JSONResponse(data, headers=hdrs), own, i)
                plan.moved.append(ESCALATED_ON_ANSWER)
                continue
            self.metrics.requests.labels(route_label, plan.tier_names[i], up.name, "ok").inc()
            if key is not None and plan.route and plan.route.store and i == 0 and rcache.storable(endpoint, data):
                await plan.route.store.set(key, data)
            return JSONResponse(data, headers=hdrs)
        if doubted is not None:
            return self.doubted(doubted, plan, route_label)
        raise APIError(502, "no tier could answer", type_="upstream_error", code="upstream_failed")

    def doubted(self, doubted: tuple[JSONResponse, dict[str, str], int], plan: Plan, route_label: str) -> JSONResponse:
        i = doubted[2]
        self.metrics.requests.labels(route_label, plan.tier_names[i], plan.tiers[i].name, "ok").inc()
        return doubted[0]

    async def buffered(self, body: dict[str, Any], plan: Plan, endpoint: str, key: str | None,
                        route_label: str, hold: Hold | None = None) -> Response:
        """A stream on a route with escalation.on_answer.buffer_streams: answered whole (checked like a
        non-streamed request), then sent as the stream the client asked for."""
        resp = await self.complete(answers.unbuffered(body), plan, endpoint, key, route_label, hold)
        if resp.status_code != 200 or not isinstance(resp, JSONResponse):
            return resp
        events = rcache.sse_from_response(json.loads(bytes(resp.body)), endpoint, rcache.stream_wants_usage(body))
        hdrs = {k: v for k, v in resp.headers.items() if k not in ("content-length", "content-type")}
        return StreamingResponse(replay(events), headers={**hdrs, **SSE_HEADERS}, media_type="text/event-stream")

    async def stream(self, body: dict[str, Any], plan: Plan, endpoint: str, key: str | None,
                      route_label: str, hold: Hold | None = None) -> Response:
        for i, up in enumerate(plan.tiers):
            plan.tried.append(i)
            t0 = time.perf_counter()
            try:
                resp, translator = await self.caller.open_stream(up, endpoint, body, self.attempt(plan, i))
            except UpstreamRejected as rej:
                return self.rejected(rej, plan, i, key, route_label)
            except UpstreamFailed as exc:
                self.failed(exc, plan, i, route_label)
                continue
            self.metrics.revision_requests.labels(up.name, resp.revision).inc()
            store = plan.route.store if (plan.route and key is not None and i == 0) else None
            gen = relay(self.metrics, resp, translator, up, t0, route_label, plan.tier_names[i], store, key, endpoint,
                        hold, rcache.stream_wants_usage(body),
                        lambda text: estimated_usage(body, plan.prompt_tokens, text))
            replica = {REPLICA_HEADER: resp.replica} if resp.replica else {}
            return StreamingResponse(gen, media_type="text/event-stream", headers={
                **relayed_headers(resp.headers), **plan_headers(plan, i, cache_state(key)),
                REVISION_HEADER: resp.revision, **replica, **SSE_HEADERS})
        raise APIError(502, "no tier could answer", type_="upstream_error", code="upstream_failed")
