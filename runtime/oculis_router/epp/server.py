"""The gRPC shell of `oculis epp`: Envoy's ExternalProcessor (one stream per HTTP request) and gRPC health
(`liveness`, `readiness` and the ext_proc service name), plus the loops that keep the replicas current.

One stream, in FULL_DUPLEX_STREAMED body mode (the protocol's MUST): the request headers are held, the
body's pieces gathered until it ends (refused with 413 as soon as it passes the router's limit), then the
answer goes back as the headers response (destination header + `envoy.lb` metadata, route cache cleared)
followed by the body as streamed pieces. A request without a body (GET) is answered at its headers. The
response's headers say which endpoint served (`core.Picker.served`); a response body, if the proxy sends
it, is passed back as it comes. The lease on the picked replica (its in-flight count) ends with the
stream, that is with the HTTP request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from oculis_router.endpoints import EndpointResolver
from oculis_router.epp import messages
from oculis_router.epp.core import Decision, Picker
from oculis_router.epp.decisions import DESTINATION, SERVED_KEY, endpoint_of
from oculis_router.errors import APIError

log = logging.getLogger("oculis.epp")
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
PROBE_S = 1.0  # replicas probed (and their gauges read) this often
SYNC_S = 0.25  # the replica sources re-read this often (as the router does)
STOP_GRACE_S = 5.0


@dataclass
class Exchange:
    """One HTTP request as the stream has seen it so far."""

    headers: dict[str, str] = field(default_factory=dict)
    subset: list[str] | None = None
    body: bytearray = field(default_factory=bytearray)
    decision: Decision | None = None
    answered: bool = False


class Processor(ep_grpc.ExternalProcessorServicer):  # type: ignore[misc]  # generated stubs are untyped
    def __init__(self, picker: Picker) -> None:
        self.picker = picker

    def answer(self, x: Exchange, with_body: bool) -> list[ep.ProcessingResponse]:
        """The request's verdict: the headers response (and the body) for a pick, or an immediate error."""
        p, target = self.picker, self.picker.target
        x.answered = True
        t0 = time.perf_counter()
        try:
            d = p.decide(endpoint_of(x.headers.get(":path", "")), bytes(x.body) if with_body else None, x.subset)
        except APIError as err:
            p.epp.requests.labels(target, f"error_{err.status}").inc()
            return [messages.immediate(err)]
        x.decision = d
        p.epp.requests.labels(target, "picked").inc()
        hdrs = dict(d.answer.headers)
        body = d.answer.body if d.answer.body is not None else bytes(x.body)
        if with_body and d.answer.body is not None:
            hdrs["content-length"] = str(len(body))
        out = [messages.request_headers(hdrs, (DESTINATION, d.answer.value))]
        if with_body:
            out += messages.streamed_body(body)
        p.epp.decision.labels(target).observe(time.perf_counter() - t0)
        return out

    async def Process(self, request_iterator: AsyncIterator[ep.ProcessingRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[ep.ProcessingResponse]:
        x = Exchange()
        try:
            async for req in request_iterator:
                kind = req.WhichOneof("request")
                if kind == "request_headers":
                    x.headers = messages.header_map(req.request_headers.headers)
                    x.subset = messages.subset_hint(req)
                    if req.request_headers.end_of_stream:
                        for r in self.answer(x, with_body=False):
                            yield r
                    elif (err := self.picker.declared_too_large(x.headers)) is not None:
                        self.picker.epp.requests.labels(self.picker.target, "error_413").inc()
                        yield messages.immediate(err)
                        return
                elif kind == "request_body":
                    x.body += req.request_body.body
                    if len(x.body) > self.picker.body_limit() or req.request_body.end_of_stream:
                        out = self.answer(x, with_body=True)
                        for r in out:
                            yield r
                        if out[0].HasField("immediate_response"):
                            return
                elif kind == "request_trailers":
                    if not x.answered:  # the body ended with trailers
                        out = self.answer(x, with_body=True)
                        for r in out:
                            yield r
                        if out[0].HasField("immediate_response"):
                            return
                    yield messages.trailers(response=False)
                elif kind == "response_headers":
                    hdrs = messages.header_map(req.response_headers.headers)
                    if x.decision is not None:
                        self.picker.served(x.decision, messages.served(req, hdrs), hdrs.get(":status", ""))
                    yield messages.response_headers(remove=[SERVED_KEY] if SERVED_KEY in hdrs else [])
                elif kind == "response_body":
                    for r in messages.streamed_body(req.response_body.body, response=True,
                                                    end=req.response_body.end_of_stream):
                        yield r
                elif kind == "response_trailers":
                    yield messages.trailers(response=True)
        finally:
            if x.decision is not None:
                x.decision.lease.release()


async def keep_current(picker: Picker, http: aiohttp.ClientSession, status: health.aio.HealthServicer) -> None:
    """Replica sources re-read every SYNC_S, probed every PROBE_S; readiness follows the probes (NOT_SERVING
    while no replica answers, SERVING again as soon as one does)."""
    last_probe = 0.0
    failing: str | None = None
    while True:
        try:
            picker.sync()
            if time.monotonic() - last_probe >= PROBE_S:
                last_probe = time.monotonic()
                await picker.probe(http)
                ready = picker.ready()
                state = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
                for name in ("readiness", EXT_PROC, ""):
                    await status.set(name, state)
            failing = None
        except Exception as exc:  # bad data from a source must not end the loop: logged once per cause
            if str(exc) != failing:
                log.exception("replica discovery failed (keeping the last replicas): %s", exc)
            failing = str(exc)
        await asyncio.sleep(SYNC_S)


async def serve(picker: Picker, host: str, port: int, reload_interval: float = 1.0,
                endpoints: Path | None = None) -> None:
    """Serve until SIGTERM or SIGINT (then readiness turns NOT_SERVING and the streams in flight get a grace).
    `endpoints`: an endpoint map (as `oculis serve --endpoints`), read within the event loop."""
    if endpoints is not None:
        picker.resolver = EndpointResolver(endpoints)
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 8 * 1024 * 1024),
                                      ("grpc.max_send_message_length", 8 * 1024 * 1024)])
    ep_grpc.add_ExternalProcessorServicer_to_server(Processor(picker), server)
    status = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(status, server)
    await status.set("liveness", health_pb2.HealthCheckResponse.SERVING)
    for name in ("readiness", EXT_PROC, ""):
        await status.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.add_insecure_port(f"{host}:{port}")
    # Replicas are dialled at their own addresses (the endpoint map's are already 127.0.0.1 ports).
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200), trust_env=False) as http:
        from oculis_router.slices import slice_watch

        picker.slices = slice_watch(http)  # in a cluster: the Services' EndpointSlices; else None
        tasks = [asyncio.create_task(keep_current(picker, http, status)),
                 *([asyncio.create_task(picker.slices.run())] if picker.slices is not None else [])]
        if picker.holder.path is not None:
            tasks.append(asyncio.create_task(picker.holder.watch(reload_interval)))
        picker.sync()
        await server.start()
        log.info("oculis epp: ext_proc and gRPC health on %s:%d for %s", host, port, picker.target)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
            # A rolling restart: readiness goes first so the proxy stops opening streams here, then the
            # streams in flight (requests still being answered) get STOP_GRACE_S to end.
            await status.enter_graceful_shutdown()
            log.info("oculis epp: stopping (%g s for the streams in flight)", STOP_GRACE_S)
        finally:
            for t in tasks:
                t.cancel()
            with contextlib.suppress(Exception):
                await server.stop(STOP_GRACE_S)
