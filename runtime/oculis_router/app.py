"""The OpenAI-compatible HTTP front of the router (Starlette). Thin: parse and check the request,
then follow the request path, one module per step: plan the tiers (`plan`), pick the replica
(`pick`), call the upstream (`call`), relay the answer (`relay`); the response cache (`cache`) and the
rate limits (`limits_store`) sit between plan and call. Never a traceback or a silent drop: every
failure is an OpenAI error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route as HTTPRoute

from oculis import Pricing, RouterConfig
from oculis_router import cache as rcache
from oculis_router import replicas
from oculis_router.batch.api import BatchAPI, Stores, unavailable_errors
from oculis_router.batch.runner import Runner as BatchRunner
from oculis_router.call import Calls
from oculis_router.decisionlog import DecisionSink
from oculis_router.decisionlog import entry as decision_entry
from oculis_router.endpoints import EndpointResolver
from oculis_router.errors import APIError
from oculis_router.flowcontrol import BATCH_PRIORITY, PRIORITY_HEADER, FlowControl, PriorityRefused, Standing, standing
from oculis_router.flowcontrol.seating import seated, take_seat
from oculis_router.flowcontrol.standing import REQUEST_PRIORITY, flow_of
from oculis_router.inbound import HeaderLimit, check_body, check_client_key, disconnected, read_body, tenant_of
from oculis_router.kvsub import Subscriptions
from oculis_router.limits import Identity, identity_of
from oculis_router.metrics import Metrics
from oculis_router.pick import Fleet
from oculis_router.plan import Plan, chains, cold_start, plan_request
from oculis_router.plan import headers as plan_headers
from oculis_router.relay import SSE_HEADERS, held, replay
from oculis_router.slices import slice_watch
from oculis_router.state import ConfigHolder, Runtime, describe
from oculis_router.upstreams import Caller
from oculis_router.verdicts import failure_kind

WATCH_CLIENT_AFTER_S = 0.25  # non-streamed answers slower than this are cancelled if the client leaves
BATCH_RESCAN_S = 2.0  # how often a router on Redis looks for open batches to share
log = logging.getLogger("oculis.router")
INTERNAL = APIError(500, "internal router error (logged by the router)", type_="server_error", code="internal")


@dataclass(frozen=True)
class Internal:
    """A request the router makes of itself (a batch line): its body and who it is for, already checked
    when the batch was created; it runs at the batch priority, below every interactive request."""

    body: dict[str, Any]
    tenant: str
    who: Identity


class Router:
    """The request path: plan (tier) -> pick (replica) -> call -> relay; `handle` reads it top to bottom."""

    def __init__(self, holder: ConfigHolder, metrics: Metrics, client_keys_env: str | None = None,
                 fleet: Fleet | None = None) -> None:
        self.holder, self.metrics = holder, metrics
        self.fleet = fleet or Fleet(metrics)
        self.flow = FlowControl(metrics.registry)  # requests wait here when their tier is full (flowcontrol/)
        self.calls = Calls(None, metrics)  # its caller needs the event loop: the app's lifespan sets it
        self.client_keys_env = client_keys_env  # from the command line; else the config's server setting
        self.decisions = DecisionSink()

    def logged(self, plan: Plan, body: dict[str, Any], resp: Response) -> Response:
        """The response, after its route's decision log (if any) has its line."""
        cfg = plan.route.route.decision_log if plan.route else None
        if cfg is not None and plan.route is not None:
            self.decisions.write(cfg, decision_entry(cfg, plan.route.route.name, body, plan.complexity,
                                                     plan.confidence, plan.prompt_tokens, resp.status_code,
                                                     resp.headers, routed_tier=plan.routed_tier()))
        return resp

    def keys_env(self, rt: Runtime) -> str | None:
        return self.client_keys_env or rt.config.server.client_keys_env

    def standing(self, rt: Runtime, plan: Plan, who: Identity, route_label: str, request: Request,
                 internal: Internal | None) -> Standing:
        """The request's flow and priority for flow control (a 400/403 for a priority it may not have)."""
        server, route = rt.config.server, plan.route.route if plan.route else None
        if internal is not None:
            return Standing(flow_of(server.flow_control, who, route_label), BATCH_PRIORITY)
        try:
            return standing(server, route, who, route_label, request.headers.get(PRIORITY_HEADER))
        except PriorityRefused as exc:
            raise APIError(exc.status, str(exc), type_="invalid_request_error" if exc.status == 400
                           else "permission_error", param="X-Oculis-Priority", code="priority_not_allowed") from None

    async def handle(self, request: Request, endpoint: str, internal: Internal | None = None) -> Response:
        rt = self.holder.current  # this request's config snapshot, whatever reloads happen meanwhile
        route_label = "-"
        plan: Plan | None = None  # once routed, an error answer still gets its decision-log line
        body: dict[str, Any] = {}
        try:
            if internal is None:  # a batch line's key was checked when its batch was created
                check_client_key(request, self.keys_env(rt))
            if self.holder.waiting:
                raise APIError(503, f"no router config loaded yet: waiting for {self.holder.path}; in a cluster it "
                                    "appears once an InferenceRoute exists in this namespace",
                               type_="service_unavailable", code="no_config")
            body = internal.body if internal else await read_body(request, rt.config.server.max_body_bytes)
            body = check_body(body, endpoint, rt.config.server.max_messages)
            plan = plan_request(rt, body, self.metrics, endpoint)
            route_label = body["model"]
            # the limiter's identity and the cache's partition
            tenant = internal.tenant if internal else tenant_of(request)
            who = internal.who if internal else identity_of(request.headers, tenant)
            place = self.standing(rt, plan, who, route_label, request, internal)
            REQUEST_PRIORITY.set(place.priority)  # this request's task only: upstreams with priority scheduling
            # The cache first: a stored answer needs no upstream, so neither a cold start (a wait, or a
            # 503) nor a token or dollar limit (it spends none) stands in its way; it counts as a request.
            key = self.cache_key(plan, body, tenant, endpoint)
            if key is not None and (hit := await self.cached(rt, plan, body, key, who, endpoint, route_label)):
                return hit
            first = plan.tiers[0]
            plan = await cold_start(plan, route_label, self.holder, self.metrics)
            if key is not None and plan.tiers[0] is not first:  # escalated past a tier at zero: its own key
                key = self.cache_key(plan, body, tenant, endpoint)
                if key is not None and (hit := await self.cached(rt, plan, body, key, who, endpoint, route_label)):
                    return hit
            if key is not None:
                self.metrics.cache.labels(route_label, "miss").inc()
            # Admission: after the plan (its prompt count and tiers' prices), before the upstream.
            hold = None if rt.limiter is None else await rt.limiter.admit(
                rt.config.server, plan.route.route if plan.route else None, route_label, who, body,
                plan.prompt_tokens, [u.pricing for u in plan.tiers], *chains(plan))
            # Flow control: after admission (a refused request never queues), before the upstream
            try:
                seat = await take_seat(self.flow, self.fleet, rt.config.server, plan, route_label, place,
                                       None if internal else lambda: disconnected(request))
            except BaseException:
                if hold is not None:
                    await hold.settle()  # nothing was spent: the reservation goes back
                raise
            if body.get("stream"):
                check = plan.route.route.escalation.on_answer if plan.route else None
                if check is not None and check.buffer_streams and plan.route and plan.route.route.escalation.enabled:
                    # answered whole before any byte goes out: a client that leaves meanwhile stops it, as below
                    return self.logged(plan, body, await self.unless_client_leaves(
                        request, held(hold, seated(seat, self.calls.buffered(body, plan, endpoint, key, route_label,
                                                                             hold))), route_label, plan))
                return self.logged(plan, body, await held(
                    hold, seated(seat, self.calls.stream(body, plan, endpoint, key, route_label, hold))))
            return self.logged(plan, body, await self.unless_client_leaves(
                request, held(hold, seated(seat, self.calls.complete(body, plan, endpoint, key, route_label, hold))),
                route_label, plan))
        except APIError as err:
            # A tier's failure names the tier and upstream that failed last (Calls.failed), a cold start its upstream
            self.metrics.requests.labels(route_label, err.headers.get("x-oculis-tier", "-"),
                                         err.headers.get("x-oculis-upstream", "-"), f"error_{err.status}").inc()
            return err.response() if plan is None else self.logged(plan, body, err.response())
        except ClientDisconnect:  # the client left while sending its body: its doing, not an internal error
            self.metrics.requests.labels(route_label, "-", "-", "client_closed").inc()
            return Response(status_code=499)
        except asyncio.CancelledError:
            if internal is not None or not self.left_while_queued(request):
                raise
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
    def left_while_queued(request: Request) -> bool:
        """Whether a CancelledError is the flow-control wait giving up for a client that left (its task
        goes on to answer 499), not a cancellation of the task itself (shutdown)."""
        me = asyncio.current_task()
        return me is not None and me.cancelling() == 0

    @staticmethod
    def cache_key(plan: Plan, body: dict[str, Any], tenant: str, endpoint: str) -> str | None:
        """The response cache's key of this request on the plan's first tier, None when it is not cached."""
        if plan.route and plan.route.store and rcache.cacheable(plan.route.route.cache, body):
            return rcache.cache_key(plan.route.route.cache, body, tenant, plan.tiers[0], endpoint)
        return None

    async def cached(self, rt: Runtime, plan: Plan, body: dict[str, Any], key: str, who: Identity, endpoint: str,
                     route_label: str) -> Response | None:
        """The stored answer, replayed as the request asks (whole or streamed), or None. A hit counts
        against the request limits (requests_per_minute paces a client whatever answers it), never
        against tokens or budgets: it spends none."""
        assert plan.route is not None and plan.route.store is not None
        hit = await plan.route.store.get(key)
        if hit is None:
            return None
        hold = None if rt.limiter is None else await rt.limiter.admit(
            rt.config.server, plan.route.route, route_label, who, body, plan.prompt_tokens, [], free=True)
        self.metrics.cache.labels(route_label, "hit").inc()
        self.metrics.requests.labels(route_label, plan.tier_names[0], plan.tiers[0].name, "cache_hit").inc()
        hdrs = plan_headers(plan, 0, "hit")
        if hold is not None:
            await hold.settle()
            hdrs.update(hold.headers)
        if body.get("stream"):
            events = rcache.sse_from_response(hit, endpoint, rcache.stream_wants_usage(body))
            return self.logged(plan, body, StreamingResponse(
                replay(events), headers={**hdrs, **SSE_HEADERS}, media_type="text/event-stream"))
        return self.logged(plan, body, JSONResponse(hit, headers=hdrs))

    async def unless_client_leaves(self, request: Request, work: Coroutine[Any, Any, Response],
                                   route_label: str, plan: Plan) -> Response:
        """Run `work`, but cancel it if the client disconnects first: its upstream call is then closed
        and the engine stops generating an answer nobody will read (a client timing out and
        retrying would otherwise pay for the same tokens twice). Counted with the tier and upstream
        that were answering, as a stream the client leaves is."""
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
        tier, upstream = plan.trying()
        self.metrics.requests.labels(route_label, tier, upstream, "client_closed").inc()
        # nobody reads it (nginx's code for "client closed request"); the decision log does
        return Response(status_code=499, headers={"x-oculis-tier": tier, "x-oculis-upstream": upstream}
                        if plan.tried else None)


def build_app(config_path: Path | None = None, config: RouterConfig | None = None, metrics: Metrics | None = None,
              reload_interval: float = 1.0, max_retries: int = 2, backoff: float = 0.05,
              wait_for_config: bool = False, client_keys_env: str | None = None,
              endpoints: Path | None = None, redis_url: str | None = None,
              server: dict[str, Any] | None = None) -> Starlette:
    """`endpoints`: an endpoint map (oculis_router.endpoints) that sends base_url hosts to loopback ports.
    `redis_url`: the response cache and the rate limiter of every config loaded use this Redis."""
    metrics = metrics or Metrics()
    holder = ConfigHolder(config_path, metrics, config, wait_for_file=wait_for_config, redis_url=redis_url,
                          server=server)
    fleet = Fleet(metrics)  # the replicas of self-hosted upstreams, and their pickers (pick.py)
    router = Router(holder, metrics, client_keys_env, fleet)

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

    async def batch_line(endpoint: str, body: dict[str, Any], tenant: str, who: Identity) -> Response:
        """A batch line through the request path, as its owner, at the batch priority."""
        scope = {"type": "http", "method": "POST", "path": f"/v1/{endpoint}", "headers": [], "query_string": b""}

        async def never() -> dict[str, Any]:  # no client to leave: the line's answer is always read
            await asyncio.Event().wait()
            return {"type": "http.disconnect"}

        return await router.handle(Request(scope, never), endpoint, Internal(body, tenant, who))

    def prices(upstream: str) -> Pricing | None:
        up = holder.current.upstreams.get(upstream)
        return up.pricing if up is not None else None

    batches = BatchRunner(batch_line, metrics.registry, prices)
    batch_stores = Stores(lambda: holder.current.config.server.batch.directory,
                          lambda: holder.current.config.server.redis_url)

    async def keep_resuming() -> None:
        """Open batches go on: at start (a previous run's), and with Redis every RESCAN_S (those another
        replica left when it died, or made after this one started: replicas share them line by line)."""
        while True:
            cfg = holder.current.config.server if not holder.waiting else None
            if cfg is not None and cfg.batch.enabled:
                try:
                    store = batch_stores()
                    open_ = await asyncio.to_thread(store.open_batches)
                    for b in open_:
                        batches.start(store, b, cfg.batch.concurrency)
                except unavailable_errors() as exc:
                    log.warning("batch store: cannot look for open batches: %s", exc)
                if cfg.redis_url is None:
                    return  # one replica on a directory: what it starts itself is all there is
            await asyncio.sleep(BATCH_RESCAN_S)
    batch_api = BatchAPI(lambda: holder.current.config.server.batch,
                         lambda request: check_client_key(request, router.keys_env(holder.current)),
                         lambda: [m["id"] for m in describe(holder.current)], batches, batch_stores)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openapi_json(request: Request) -> Response:
        from oculis_router.openapi import document

        return JSONResponse(document([m["id"] for m in describe(holder.current)]))

    async def readyz(request: Request) -> Response:
        # A rejected newer file is named beside the config in force: "ready" says what serves, never
        # that the file on disk does.
        pending = {"rejected": {"config": holder.rejected.digest[:12], "reason": holder.rejected.reason}} \
            if holder.rejected else {}
        if holder.waiting:
            return JSONResponse({"status": "waiting for config", "config": str(holder.path), **pending},
                                status_code=503)
        if holder.watch_stopped:  # serving, but blind to config changes: not a state to stay in unnoticed
            return JSONResponse({"status": f"config reload watcher stopped: {holder.watch_stopped}",
                                 "config": holder.current.digest[:12], **pending}, status_code=503)
        return JSONResponse({"status": "ready", "config": holder.current.digest[:12], **pending})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        resolver: EndpointResolver | None = None
        if endpoints is None:
            connector = aiohttp.TCPConnector(limit=2000, limit_per_host=1000, keepalive_timeout=60)
        else:  # no DNS cache: each new connection asks the map, which follows pods as they come and go
            resolver = EndpointResolver(endpoints)
            connector = aiohttp.TCPConnector(limit=2000, limit_per_host=1000, keepalive_timeout=60,
                                             resolver=resolver, use_dns_cache=False)
        http = aiohttp.ClientSession(connector=connector, trust_env=False)
        router.calls.caller = Caller(http, max_retries=max_retries, backoff=backoff, fleet=fleet,
                                     on_canary_failure=lambda up, v: metrics.upstream_failures.labels(
                                         up.name, failure_kind(v), "canary").inc())
        slices = slice_watch(http)  # in a cluster: the Services' EndpointSlices; else None
        subs = Subscriptions(fleet, metrics)
        fleet.refresh = lambda: fleet.sync(replicas.found(holder.current.config, resolver, slices))
        fleet.refresh()  # the first requests pick too
        tasks = [asyncio.create_task(t) for t in (
            replicas.keep_synced(fleet, lambda: holder.current.config, resolver, slices, subs.sync),
            replicas.keep_scraping(fleet, http), *([slices.run()] if slices is not None else []))]
        watcher = asyncio.create_task(holder.watch(reload_interval)) if config_path else None
        resuming = asyncio.create_task(keep_resuming())
        yield
        resuming.cancel()
        await batches.close()
        if watcher:
            watcher.cancel()
        for task in tasks:
            task.cancel()
        subs.close()
        router.flow.close()
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
        *batch_api.routes(),
    ], lifespan=lifespan,
        middleware=[Middleware(HeaderLimit, limit=lambda: holder.current.config.server.max_header_bytes)])
    app.state.metrics = metrics
    app.state.holder = holder
    app.state.fleet = fleet  # what the pickers know (tests and debugging read it)
    return app
