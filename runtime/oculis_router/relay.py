"""Step 4 of the request path (plan -> pick -> call -> relay): the answer goes to the client. A
stream's bytes flow as they arrive while a copy is parsed on the side for usage and the cache; a
stream that breaks after bytes went out ends with an error event, never a hang. Usage is counted
(and billed to the rate-limit hold) here, once per call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import aiohttp
from starlette.responses import Response, StreamingResponse

from oculis import Upstream
from oculis_router import cache as rcache
from oculis_router.limits_store import Hold
from oculis_router.metrics import Metrics
from oculis_router.pick import adapter_of
from oculis_router.sse import StreamCollector, generated_text, without_usage_chunks
from oculis_router.streamcheck import EventGate, MalformedStream
from oculis_router.upstreams import Stream
from oculis_router.usage import Usage, cost_dollars
from oculis_router.verdicts import IdleTimeout

# Proxies (nginx ingress, CDNs) buffer or cache responses unless told not to; a stream must flow.
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
log = logging.getLogger("oculis.router")


_SAID_NO_USAGE: set[str] = set()  # upstreams whose answers without usage were logged (once each)


def estimated_usage(body: dict[str, Any], prompt_tokens: int | None, text: str) -> Usage:
    """Usage of a call the upstream reported none for, by the classifier's tokenizer: the prompt's count
    (the plan's when it was classified) and the generated text's."""
    from oculis_router.classify import piece_ids
    from oculis_router.limits_store import prompt_tokens_of

    prompt = prompt_tokens if prompt_tokens is not None else prompt_tokens_of(body)
    return Usage(prompt, piece_ids(text)[1] if text else 0, 0, 0)


def estimate_of(body: dict[str, Any], prompt_tokens: int | None, answer: dict[str, Any],
                endpoint: str) -> Callable[[], Usage]:
    """The estimate of a whole answer's usage, computed only if it reported none (account)."""
    return lambda: estimated_usage(body, prompt_tokens, generated_text(answer, endpoint))


def account(metrics: Metrics, up: Upstream, usage: dict[str, Any] | None, hold: Hold | None = None,
            estimate: Callable[[], Usage] | None = None, why: str = "not_reported") -> None:
    """Meter one call: its tokens and cost in the metrics and, the same figures, in the rate-limit hold.
    A call without usage is metered by `estimate` (its text) and counted in oculis_usage_estimated_total,
    never as 0 tokens and $0; `why` it has none: not_reported (the upstream sends none), stream_cut (a
    stream that ended before its usage chunk), client_closed (a whole answer the client left: its prompt)."""
    u = Usage.parse(usage)
    if u is None and estimate is not None:
        u = estimate()
        metrics.usage_estimated.labels(up.name, why).inc()
        if why == "not_reported" and up.name not in _SAID_NO_USAGE:
            _SAID_NO_USAGE.add(up.name)
            log.warning("upstream %s answered without usage; its tokens and cost are estimated from the text "
                        "(oculis_usage_estimated_total)", up.name)
    if hold is not None:  # the limits settle on the same usage the metrics count (one cost, one place)
        hold.record(up.pricing, u)
    if u is None:
        return
    metrics.prompt_tokens.labels(up.name).inc(u.prompt)
    metrics.completion_tokens.labels(up.name).inc(u.completion)
    metrics.cached_tokens.labels(up.name).inc(u.cached)
    metrics.cache_write_tokens.labels(up.name).inc(u.cache_written)
    dollars = cost_dollars(up.pricing, u)
    metrics.cost.labels(up.name).inc(dollars)
    if (adapter := adapter_of(up)) is not None:  # only declared adapters reach here: bounded labels
        metrics.adapter_prompt_tokens.labels(up.name, adapter).inc(u.prompt)
        metrics.adapter_completion_tokens.labels(up.name, adapter).inc(u.completion)
        metrics.adapter_cost.labels(up.name, adapter).inc(dollars)


async def relay(metrics: Metrics, resp: Stream, translator: Any, up: Upstream, t0: float, route_label: str,
                tier: str, store: rcache.Store | None, key: str | None,
                endpoint: str = "chat", hold: Hold | None = None, include_usage: bool = True,
                estimate: Callable[[str], Usage] | None = None) -> AsyncIterator[bytes]:
    """Bytes go to the client as they arrive; a copy is parsed on the side for usage and the cache.
    `include_usage`: whether the client asked for the usage chunk (the upstream always sends one);
    `estimate`: the usage of the text generated, for a stream that ends without its usage chunk."""
    collector = StreamCollector(endpoint)
    gate = EventGate(up.name)  # whole, well-formed events only, and a stream that ends with [DONE]
    first = True
    outcome = "ok"
    try:
        async for raw in resp:  # each read bounded by the idle timeout (IdleTimeout)
            if first:
                metrics.ttft.labels(up.name).observe(time.perf_counter() - t0)
                first = False
            chunk = gate.feed(b"".join(translator.feed(raw)) if translator else raw)
            if chunk:
                collector.feed(chunk)
                if hold is not None:
                    hold.relayed(chunk)
                if shown := (chunk if include_usage else without_usage_chunks(chunk)):
                    yield shown
            if gate.failure:
                raise gate.failure
        if chunk := gate.close():
            collector.feed(chunk)
            if shown := (chunk if include_usage else without_usage_chunks(chunk)):
                yield shown
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
        if isinstance(exc, aiohttp.ClientError | TimeoutError):  # the replica's connection broke, or it went silent
            resp.replica_failed()
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
        metrics.upstream_latency.labels(up.name).observe(time.perf_counter() - t0)
        metrics.requests.labels(route_label, tier, up.name, outcome).inc()
        account(metrics, up, collector.usage, hold,
                None if estimate is None else (lambda: estimate(collector.generated_text())),
                "not_reported" if collector.complete else "stream_cut")
        if hold is not None:  # a cut stream settles what it used too
            await hold.settle()
    answer = collector.response()  # None unless the stream can stand for the whole answer
    if outcome == "ok" and store is not None and key is not None and answer and rcache.storable(endpoint, answer):
        await store.set(key, answer)




async def held(hold: Hold | None, work: Coroutine[Any, Any, Response]) -> Response:
    """`work`'s answer with the rate-limit headers; the hold settled once it ends, except a stream's,
    which settles when the stream does (relay)."""
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


async def replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for c in chunks:
        yield c
