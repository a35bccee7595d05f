"""Active/standby operator replicas: Lease-based leader election around kopf.

`python -m oculis_operator.leader [--namespace NS ...]` (the image's entrypoint) runs one candidate.
Every replica takes part in the election (the Kubernetes client's own `kubernetes.aio.leaderelection`
over a `coordination.k8s.io/v1` Lease, with optimistic concurrency on its resourceVersion); only the
leader starts kopf's operator in this process (standalone: kopf's peering is no lock), so only it
reconciles, posts events and serves the webhook. Followers wait; when the leader dies its Lease
expires and one takes over within `lease_duration` + `retry_period` (12 s + 2 s by default).

A leader that cannot renew its Lease within `renew_deadline` stops at once: the process exits
(`os._exit`, no cleanup that could still write), so two leaders never reconcile together for longer
than the gap between the deadline and the Lease's expiry, which is the point of renew < lease. A
watchdog enforces the deadline even when a renewal hangs (the client has no request timeout). On
SIGTERM the leader stops kopf, then gives the Lease up (holder cleared) so a follower takes over at
once instead of after the Lease expires.

Health on OCULIS_HEALTH_PORT (default 8080): `/healthz` (liveness: the election runs, and on the
leader kopf runs), `/readyz` (200 for a working candidate; the JSON body reports `leader`,
`identity` and `holder`), `/leader` (200 only on the leader). Readiness is not gated on leadership:
a follower that never turns Ready would stall every rollout of the operator's own Deployment
(available never reaches replicas) and keep it Progressing in Argo CD; the leader labels its own
pod `oculis.dev/leader=true` (followers `false`), which is what the webhook Service selects.

Environment: OCULIS_LEASE_NAME (default oculis-operator), OCULIS_LEASE_NAMESPACE (default
POD_NAMESPACE, else the service account's namespace, else `default`), POD_NAME (identity and the pod
to label; else the host name), OCULIS_LEASE_DURATION / _RENEW_DEADLINE / _RETRY_PERIOD (seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from kubernetes.aio import client as aclient
from kubernetes.aio.client.exceptions import ApiException
from kubernetes.aio.leaderelection import electionconfig
from kubernetes.aio.leaderelection.leaderelectionrecord import LeaderElectionRecord
from kubernetes.aio.leaderelection.resourcelock.leaselock import LeaseLock

log = logging.getLogger("oculis.leader")
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LEADER_LABEL = "oculis.dev/leader"
EXIT_LOST = 70  # a leader that lost its Lease; the pod's restart makes it a follower again


@dataclass(frozen=True)
class Timing:
    # Shorter than client-go's 15/10/2: a killed leader must be replaced within 20 s including kopf's
    # start-up (measured 18.5 s with 15 s on a loaded 2-core machine); still 4 s of slack for renewals.
    lease_duration: float = 12.0
    renew_deadline: float = 8.0
    retry_period: float = 2.0

    def check(self) -> str | None:
        """Why these timings cannot be used (the client library's own rule), or None."""
        if min(self.lease_duration, self.renew_deadline, self.retry_period) < 1:
            return "lease duration, renew deadline and retry period must each be at least 1 s"
        if self.lease_duration <= self.renew_deadline:
            return (f"OCULIS_LEASE_DURATION ({self.lease_duration:g}) must be above OCULIS_LEASE_RENEW_DEADLINE "
                    f"({self.renew_deadline:g}): a leader must stop before its Lease can pass to another")
        if self.renew_deadline <= 1.2 * self.retry_period:
            return (f"OCULIS_LEASE_RENEW_DEADLINE ({self.renew_deadline:g}) must be above 1.2 x "
                    f"OCULIS_LEASE_RETRY_PERIOD ({self.retry_period:g})")
        return None


@dataclass
class Settings:
    lease_name: str
    lease_namespace: str
    identity: str
    pod_name: str | None
    health_port: int
    timing: Timing
    namespaces: list[str] = field(default_factory=list)  # [] = all namespaces


def settings_from(env: dict[str, str], argv: list[str]) -> Settings:
    """Pure: the environment and arguments -> settings; ValueError names the variable and the fix."""
    ap = argparse.ArgumentParser(prog="python -m oculis_operator.leader",
                                 description="run one operator replica under Lease-based leader election")
    ap.add_argument("--namespace", action="append", default=[], help="reconcile only this namespace (repeatable)")
    ap.add_argument("--all-namespaces", action="store_true", help="reconcile every namespace (the default)")
    args = ap.parse_args(argv)

    def seconds(name: str, default: float) -> float:
        raw = env.get(name, "")
        try:
            return float(raw) if raw else default
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a number of seconds; set e.g. {name}={default:g}") from None

    default = Timing()
    timing = Timing(seconds("OCULIS_LEASE_DURATION", default.lease_duration),
                    seconds("OCULIS_LEASE_RENEW_DEADLINE", default.renew_deadline),
                    seconds("OCULIS_LEASE_RETRY_PERIOD", default.retry_period))
    why = timing.check()
    if why:
        raise ValueError(why)
    port_raw = env.get("OCULIS_HEALTH_PORT", "8080")
    if not port_raw.isdigit() or not 0 <= int(port_raw) <= 65535:
        raise ValueError(f"OCULIS_HEALTH_PORT={port_raw!r} is not a port; set a number from 1 to 65535")
    namespace = env.get("OCULIS_LEASE_NAMESPACE") or env.get("POD_NAMESPACE") or (
        SA_NAMESPACE.read_text().strip() if SA_NAMESPACE.exists() else "default")
    pod = env.get("POD_NAME") or None
    # Unique even if two candidates share a host name: a restarted container must not inherit the Lease.
    identity = f"{pod or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    return Settings(env.get("OCULIS_LEASE_NAME", "oculis-operator"), namespace, identity, pod, int(port_raw),
                    timing, [] if args.all_namespaces else list(args.namespace))


@dataclass
class State:
    """What the health endpoints report."""

    identity: str
    leading: bool = False
    kopf_ready: bool = False
    holder: str | None = None
    last_renewal: float = 0.0  # monotonic time of the last successful Lease write by this candidate
    election_alive: bool = True

    def report(self) -> dict[str, Any]:
        return {"leader": self.leading, "identity": self.identity, "holder": self.holder,
                "reconciling": self.leading and self.kopf_ready}


def lost_lease(state: State, now: float, renew_deadline: float) -> bool:
    """Pure: a leader whose last successful renewal is older than the deadline must stop."""
    return state.leading and now - state.last_renewal > renew_deadline


def health_app(state: State) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(state.report(), status=200 if state.election_alive else 503)

    async def readyz(_: web.Request) -> web.Response:
        ok = state.election_alive and (state.kopf_ready or not state.leading)
        return web.json_response(state.report(), status=200 if ok else 503)

    async def leader(_: web.Request) -> web.Response:
        return web.json_response(state.report(), status=200 if state.leading and state.kopf_ready else 503)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/leader", leader)
    return app


class WatchedLease(LeaseLock):
    """The client library's LeaseLock, recording who holds the Lease and when this candidate last
    wrote it successfully (the watchdog's clock)."""

    def __init__(self, name: str, namespace: str, identity: str, api: Any, state: State) -> None:
        super().__init__(name, namespace, identity, api)
        self.state = state

    async def get(self, name: str, namespace: str) -> Any:
        found, record = await super().get(name, namespace)
        self.state.holder = getattr(record, "holder_identity", None) if found else None
        return found, record

    async def create(self, name: str, namespace: str, election_record: LeaderElectionRecord) -> bool:
        # The library's own create passes pretty=True, which the asyncio client refuses (it wants a
        # string), so it could never create the Lease; the same body otherwise.
        body = aclient.V1Lease(metadata=aclient.V1ObjectMeta(name=name), spec=self.update_lease(election_record))
        try:
            await self.api_instance.create_namespaced_lease(namespace, body)
            ok = True
        except ApiException as exc:  # another candidate created it first: the next retry reads it
            log.info(f"Lease {namespace}/{name} not created: {exc.status} {exc.reason}")
            ok = False
        if ok:
            self.state.last_renewal, self.state.holder = time.monotonic(), self.identity
        return ok

    async def update(self, name: str, namespace: str, updated_record: LeaderElectionRecord) -> bool:
        ok = await super().update(name, namespace, updated_record)
        if ok:  # the election writes only this candidate's own record
            self.state.last_renewal, self.state.holder = time.monotonic(), self.identity
        return ok


def election_config(timing: Timing, lock: LeaseLock, lead: Any, stopped: Any) -> electionconfig.Config:
    # The Lease stores whole seconds, and the library turns str(duration) back with int(): "12.0" fails.
    return electionconfig.Config(lock, math.ceil(timing.lease_duration), timing.renew_deadline,
                                 timing.retry_period, lead, stopped)


def hard_exit(code: int, why: str) -> None:
    """Stop now: no finally blocks, no kopf shutdown that could still write as a leader."""
    log.error(why)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(code)


async def label_pod(settings: Settings, leading: bool) -> None:
    """The leader's pod carries oculis.dev/leader=true (the webhook Service selects it); best effort."""
    if not settings.pod_name:
        return
    try:
        async with aclient.ApiClient() as api:
            await aclient.CoreV1Api(api).patch_namespaced_pod(
                settings.pod_name, settings.lease_namespace,
                {"metadata": {"labels": {LEADER_LABEL: "true" if leading else "false"}}})
    except Exception as exc:  # a label is advice; leadership is the Lease
        why = f"{exc.status} {exc.reason}" if isinstance(exc, ApiException) else str(exc).splitlines()[0]
        log.warning(f"could not label pod {settings.pod_name} {LEADER_LABEL}={str(leading).lower()}: {why}")


async def run(settings: Settings) -> int:
    from kubernetes.aio import config as aconfig
    from kubernetes.aio.leaderelection import leaderelection

    try:
        aconfig.load_incluster_config()  # type: ignore[no-untyped-call]
    except aconfig.ConfigException:
        await aconfig.load_kube_config()  # type: ignore[no-untyped-call]
    state = State(settings.identity)
    runner = web.AppRunner(health_app(state))
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", settings.health_port).start()
    await label_pod(settings, False)  # a restarted former leader is a follower until it wins again

    api = aclient.ApiClient()
    lock = WatchedLease(settings.lease_name, settings.lease_namespace, settings.identity, api, state)
    stop = asyncio.Event()  # SIGTERM: kopf stops, then the Lease is given up
    kopf_done = asyncio.Event()
    failed: list[bool] = []

    async def lead() -> None:
        import kopf

        import oculis_operator.handlers  # noqa: F401  (registers the handlers)

        state.leading = True
        state.last_renewal = time.monotonic()
        log.info(f"{settings.identity} leads (Lease {settings.lease_namespace}/{settings.lease_name}); "
                 "starting the operator")
        await label_pod(settings, True)
        ready = asyncio.Event()

        async def mark_ready() -> None:
            await ready.wait()
            state.kopf_ready = True

        marker = asyncio.create_task(mark_ready())
        try:
            await kopf.operator(standalone=True, clusterwide=not settings.namespaces,
                                namespaces=settings.namespaces, stop_flag=stop, ready_flag=ready)
        except asyncio.CancelledError:
            raise
        except Exception:
            failed.append(True)
            log.exception("the operator failed")
        finally:
            marker.cancel()
            kopf_done.set()

    async def stopped() -> None:
        hard_exit(EXIT_LOST, f"{settings.identity} lost the Lease {settings.lease_namespace}/{settings.lease_name}; "
                             "stopping at once")

    election = leaderelection.LeaderElection(election_config(settings.timing, lock, lead, stopped))

    async def watchdog() -> None:
        while True:
            await asyncio.sleep(0.5)
            if lost_lease(state, time.monotonic(), settings.timing.renew_deadline) and not stop.is_set():
                hard_exit(EXIT_LOST, f"{settings.identity} could not renew its Lease within "
                                     f"{settings.timing.renew_deadline:g} s; stopping at once")

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(election.run()), asyncio.create_task(watchdog())]
    # kopf installs its own SIGTERM handler while it runs: its return is the leader's shutdown signal.
    waiters: list[asyncio.Task[Any]] = [asyncio.create_task(stop.wait()), asyncio.create_task(kopf_done.wait()),
                                        *tasks]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for t in tasks:  # the election and the watchdog run forever: one that ended failed
        if t.done() and not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            log.error(f"leader election failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    # Told to stop (our handler, or kopf's own while it ran), or kopf or the election ended by itself.
    # kopf returns when told to stop and raises when it fails; the election never ends by itself.
    clean = stop.is_set() or (kopf_done.is_set() and not failed)
    stop.set()
    state.election_alive = False
    if state.leading:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(kopf_done.wait(), timeout=settings.timing.renew_deadline)
        for t in tasks:  # no renewal may follow the release
            t.cancel()
        await release(api, settings)
    for t in (*tasks, *waiters):
        t.cancel()
    await api.close()  # type: ignore[no-untyped-call]
    await runner.cleanup()
    return 0 if clean else 1


async def release(api: Any, settings: Settings) -> None:
    """Give the Lease up on a clean shutdown (client-go's ReleaseOnCancel), if this candidate still
    holds it: a follower takes over at its next retry instead of after the Lease expires."""
    leases = aclient.CoordinationV1Api(api)
    with contextlib.suppress(Exception):
        lease = await leases.read_namespaced_lease(settings.lease_name, settings.lease_namespace)
        if lease.spec is None or lease.spec.holder_identity != settings.identity:
            return
        lease.spec.holder_identity = None
        lease.spec.lease_duration_seconds = 1
        await leases.replace_namespaced_lease(settings.lease_name, settings.lease_namespace, lease)
        log.info(f"{settings.identity} released the Lease")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = settings_from(dict(os.environ), sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"oculis operator: {exc}", file=sys.stderr)
        return 2
    log.info(f"candidate {settings.identity} for Lease {settings.lease_namespace}/{settings.lease_name}: "
             + json.dumps({"namespaces": settings.namespaces or "all", **settings.timing.__dict__}))
    return asyncio.run(run(settings))


if __name__ == "__main__":
    sys.exit(main())
