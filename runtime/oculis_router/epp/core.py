"""The endpoint picker's state and one request's decision, over the router's own parts: the replicas
of each upstream and their pickers (`pick.Fleet`, kept current by `replicas.found`: the config's
`endpoints`, the endpoint map, or the Services' EndpointSlices in a cluster), the engines' gauges
(`replicas.scrape`, which doubles as the reachability probe), and for `--route` the router's plan
(`plan.plan_request`: classify, choose the tier).

A replica whose engine does not answer its probe is not picked until it answers again; one that the
proxy could not reach (the response came back without it, or as the proxy's own 503) is set aside at
once, before the next probe."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client import Counter, Gauge, Histogram

from oculis import Upstream
from oculis.router_upstream import EXTERNAL_PROVIDERS
from oculis_router import model_tokens, replicas
from oculis_router.endpoints import EndpointResolver
from oculis_router.epp.decisions import (
    DESTINATION,
    Answer,
    Endpoint,
    address_of,
    allowed,
    fallback_order,
    no_replica,
    parse_body,
    shed,
    shedding,
    too_large,
)
from oculis_router.errors import APIError
from oculis_router.metrics import Metrics
from oculis_router.pick import AdapterMissing, Fleet, Lease, Pool, adapter_of
from oculis_router.plan import headers as plan_headers
from oculis_router.plan import plan_request
from oculis_router.replicas import SliceSource
from oculis_router.state import ConfigHolder

log = logging.getLogger("oculis.epp")


class EppMetrics:
    """The picker's own series, beside the router's (picks, replica in-flight) in one registry."""

    def __init__(self, metrics: Metrics) -> None:
        r = metrics.registry
        self.requests = Counter("oculis_epp_requests", "Requests the endpoint picker answered, by outcome (picked, "
                                "error_<status>)", ["target", "outcome"], registry=r)
        self.decision = Histogram("oculis_epp_decision_seconds", "Time from the request's last body byte to the "
                                  "picker's answer", ["target"], registry=r,
                                  buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
        self.replica_up = Gauge("oculis_epp_replica_up", "1 when the replica's engine answered its last probe",
                                ["upstream", "replica"], registry=r)
        self.served_elsewhere = Counter("oculis_epp_served_elsewhere", "Responses the proxy got from another "
                                        "endpoint than the pick, or from none (the pick is set aside)",
                                        ["upstream"], registry=r)


def target_problem(holder: ConfigHolder, upstream: str | None, route: str | None) -> str | None:
    """Why the picker cannot serve this target (a one-line reason naming the fix), or None."""
    rt = holder.current
    if upstream is not None:
        up = rt.upstreams.get(upstream)
        if up is None:
            return (f"--upstream {upstream!r} is not an upstream of the config (it has: "
                    f"{', '.join(sorted(rt.upstreams)) or 'none'})")
        if up.provider in EXTERNAL_PROVIDERS:
            return (f"--upstream {upstream!r} is an external provider ({up.provider}): a gateway cannot pick its "
                    "replicas; route to it through the Oculis router, or name a self-hosted upstream")
        return None
    assert route is not None
    rr = rt.routes.get(route)
    if rr is None:
        return f"--route {route!r} is not a route of the config (it has: {', '.join(sorted(rt.routes)) or 'none'})"
    if not [t for t in rr.route.tiers if rt.upstreams[t.upstream].provider not in EXTERNAL_PROVIDERS]:
        return (f"--route {route!r} has only external-provider tiers: a gateway has no replica of theirs to pick; "
                "serve it with the Oculis router (oculis serve)")
    return None


@dataclass
class Decision:
    answer: Answer
    lease: Lease
    address: str  # the picked replica's ip:port


@dataclass
class Picker:
    """One `oculis epp` process: its target (an upstream, or a route's tiers) and what it knows."""

    holder: ConfigHolder
    metrics: Metrics
    upstream: str | None = None
    route: str | None = None
    fallbacks: int = 0
    shed_waiting: float | None = None
    resolver: EndpointResolver | None = None
    slices: SliceSource | None = None
    fleet: Fleet = field(init=False)
    down: set[str] = field(default_factory=set)  # replica ids whose engine did not answer its last probe
    probed: bool = False
    epp: EppMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.fleet = Fleet(self.metrics)
        self.epp = EppMetrics(self.metrics)

    @property
    def target(self) -> str:
        return f"upstream {self.upstream!r}" if self.upstream else f"route {self.route!r}"

    def upstreams(self) -> list[Upstream]:
        """The self-hosted upstreams this picker picks for, in tier order."""
        rt = self.holder.current
        if self.upstream is not None:
            up = rt.upstreams.get(self.upstream)
            return [up] if up is not None else []
        rr = rt.routes.get(self.route or "")
        ups = [rt.upstreams[t.upstream] for t in rr.route.tiers] if rr else []
        return [u for u in ups if u.provider not in EXTERNAL_PROVIDERS]

    def sync(self) -> None:
        names = {u.name for u in self.upstreams()}
        found = replicas.found(self.holder.current.config, self.resolver, self.slices)
        self.fleet.sync({n: v for n, v in found.items() if n in names})

    def pools(self) -> list[Pool]:
        return list(self.fleet.pools.values())

    async def probe(self, http: aiohttp.ClientSession) -> None:
        """Every replica's engine asked for its gauges; the ones that do not answer are down until they do."""
        reps = [(p.name, r) for p in self.pools() for r in list(p.replicas.values())]
        oks = await asyncio.gather(*(replicas.scrape(http, r) for _, r in reps))
        for (pool, r), ok in zip(reps, oks, strict=True):
            if ok:
                if r.id in self.down:
                    log.info("replica %s of %s answers again", r.id, pool)
                self.down.discard(r.id)
            elif r.id not in self.down:
                log.warning("replica %s of %s does not answer (%s): not picked until it does", r.id, pool, r.url)
                self.down.add(r.id)
            self.epp.replica_up.labels(pool, r.id).set(0 if r.id in self.down else 1)
        self.probed = True

    def ready(self) -> bool:
        """Readiness: probed, and some replica of the target answers."""
        return self.probed and any(r.id not in self.down for p in self.pools() for r in p.replicas.values())

    def body_limit(self) -> int:
        return self.holder.current.config.server.max_body_bytes

    def declared_too_large(self, headers: dict[str, str]) -> APIError | None:
        declared = headers.get("content-length", "")
        limit = self.body_limit()
        return too_large(int(declared), limit, declared=True) if declared.isdigit() and int(declared) > limit \
            else None

    def decide(self, endpoint: Endpoint | None, raw: bytes | None, subset: list[str] | None) -> Decision:
        """Where one request goes (raises APIError: the proxy answers it in the upstream's place)."""
        cfg = self.holder.current.config.server
        if raw is not None and len(raw) > cfg.max_body_bytes:
            raise too_large(len(raw), cfg.max_body_bytes)
        sent: dict[str, Any] = {}
        checked: dict[str, Any] = {}
        if endpoint is not None:
            sent, checked = parse_body(raw or b"", endpoint, cfg.max_messages)
        if self.route is None:
            assert self.upstream is not None
            up = self.holder.current.upstreams.get(self.upstream)
            if up is None:  # a reload dropped it: nothing to pick until the config names it again
                raise APIError(503, f"upstream {self.upstream!r} is no longer in the router config; restore it or "
                               "point the InferencePool at another picker", type_="service_unavailable",
                               code="no_replica", headers={"retry-after": "5"})
            d = self._lease(up, checked, endpoint, subset)
            if d is None:
                raise self._none(up, subset)
            return d
        return self._routed(endpoint, sent, checked, subset)

    def _routed(self, endpoint: Endpoint | None, sent: dict[str, Any], checked: dict[str, Any],
                subset: list[str] | None) -> Decision:
        """`--route`: the router's plan (classify, choose the tier), then the first tier in its order whose
        upstream has a replica to take it; the body's model becomes that upstream's."""
        rt = self.holder.current
        if endpoint is None:  # not a completion: no tier to choose; any replica of the first self-hosted tier
            ups = self.upstreams()
            for up in ups:
                if (d := self._lease(up, {}, None, subset)) is not None:
                    return d
            raise self._none(ups[0] if ups else None, subset)
        if self.route not in rt.routes:
            raise APIError(503, f"route {self.route!r} is no longer in the router config; restore it or point the "
                           "InferencePool at another picker", type_="service_unavailable", code="no_replica",
                           headers={"retry-after": "5"})
        plan = plan_request(rt, {**checked, "model": self.route}, self.metrics, endpoint)
        for i, up in enumerate(plan.tiers):
            if up.provider in EXTERNAL_PROVIDERS:
                continue
            d = self._lease(up, checked, endpoint, subset)
            if d is None:
                continue
            body = json.dumps({**sent, "model": up.model}, ensure_ascii=False).encode()
            hdrs = {**plan_headers(plan, i, None), **d.answer.headers}
            return Decision(Answer(d.answer.destinations, hdrs, body), d.lease, d.address)
        raise self._none(next((u for u in plan.tiers if u.provider not in EXTERNAL_PROVIDERS), None), subset)

    def _none(self, up: Upstream | None, subset: list[str] | None) -> APIError:
        pool = self.fleet.pool(up) if up is not None else None
        return no_replica(f"upstream {up.name!r}" if up else self.target, subset, len(pool.replicas) if pool else 0)

    def _lease(self, up: Upstream, body: dict[str, Any], endpoint: Endpoint | None,
               subset: list[str] | None) -> Decision | None:
        """A replica of `up` leased for this request, or None when none may take it (raises 429 when every
        one that may is past --shed-waiting)."""
        pool = self.fleet.pool(up)
        if pool is None:
            return None
        now = time.monotonic()
        live = {r.id: r for r in pool.members("stable") if not r.draining and r.id not in self.down
                and r.aside_until <= now}
        if not live:  # a canary-only pool, or every stable replica down: the canary's
            live = {r.id: r for r in pool.replicas.values() if not r.draining and r.id not in self.down
                    and r.aside_until <= now}
        addresses = {rid: address_of(r.url) for rid, r in live.items()}
        ok = allowed(addresses, live, subset)
        if not ok:
            return None
        if shed((live[rid].gauges.get("waiting", 0.0) for rid in ok), self.shed_waiting):
            raise shedding(f"upstream {up.name!r}", self.shed_waiting or math.inf)
        revision = live[next(iter(ok))].revision
        tokenizer = model_tokens.load(up.tokenizer) if up.tokenizer else None
        try:
            lease = pool.lease(body, endpoint or "completions", revision, set(), adapter_of(up), tokenizer, only=ok)
        except AdapterMissing as exc:  # as the router answers it: the adapter may still be loading
            if self.route is not None:
                return None  # the next tier of the route may serve
            raise APIError(503, str(exc), type_="service_unavailable", code="adapter_not_loaded",
                           headers={"retry-after": "5"}) from None
        if lease is None:
            return None
        picked = addresses[lease.replica.id]
        others = [(addresses[rid], live[rid].in_flight + live[rid].gauges.get("waiting", 0.0))
                  for rid in ok if rid != lease.replica.id]
        dest = fallback_order(picked, others, self.fallbacks)
        return Decision(Answer(dest, {DESTINATION: ",".join(dest)}), lease, picked)

    def served(self, d: Decision, served: str | None, status: str) -> None:
        """The response path: the proxy says which endpoint answered. Another one than the pick (the proxy
        moved down the list), or none and the proxy's own 503 (it could not connect): the pick is set aside,
        as the router does after a failed call, and probed again."""
        if served is not None and served.split(",")[0].strip() == d.address:
            return
        if served is None and status != "503":
            return  # a proxy that does not report the served endpoint: nothing to learn
        self.epp.served_elsewhere.labels(d.lease.pool.name).inc()
        d.lease.failed()
