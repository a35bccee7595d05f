"""The HTTP load of `oculis bench run`: a seeded workload sent to an OpenAI-compatible server, open loop
(arrivals) or closed loop (a fixed concurrency), warm-up marked, in-flight requests drained, each
request's outcome recorded as a RequestResult. It speaks only OpenAI HTTP, so it runs unchanged against
the simulator, real vLLM and hosted providers.

A run whose first EARLY_N finished requests all failed the same way stops there (failures.early_failure):
nothing more would be learnt by sending the rest. Every request records when it ended, whatever its
outcome, so the measured window (stats.measured_window) never shrinks because requests failed fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oculis_measure.bench.failures import api_base, early_failure, error_text
from oculis_measure.bench.stats import RequestResult
from oculis_measure.bench.workload import PlannedRequest, Workload

SIM_FINGERPRINT = "oculis-simulator"


@dataclass(frozen=True, slots=True)
class LoadPlan:
    url: str  # base URL, with or without /v1
    route: str
    warmup_s: float
    duration_s: float
    drain_s: float
    timeout_s: float
    concurrency: int | None = None  # closed loop; None: the workload's arrivals
    headers: dict[str, str] = field(default_factory=dict)
    salt: str = ""  # a word unique to this run at the start of every prompt ("" : none)


@dataclass(slots=True)
class LoadResult:
    results: list[RequestResult]
    wall_start: float  # time.time() at the run's start
    aborted: str | None = None  # the error kind the first requests all shared, when the run stopped early
    # how late the client's own 0.25 s ticker woke, in seconds, while measuring: the machine's CPU contention
    # as this process felt it (the router and engine on the same machine wait alike)
    loop_lag_s: list[float] = field(default_factory=list)


def salted(messages: list[dict[str, str]], salt: str) -> list[dict[str, str]]:
    """The same word at the very start of every prompt of a run: a prefix no earlier run sent, while the
    prefixes the run's own prompts share (system prompts, documents) stay shared."""
    if not salt:
        return messages
    return [{**messages[0], "content": f"{salt} {messages[0]['content']}"}, *messages[1:]]


async def one_request(client: Any, route: str, req: PlannedRequest, result: RequestResult, t0: float,
                      timeout: float, salt: str = "") -> None:
    """Send one streamed chat request and record what the client saw."""
    import httpx

    loop = asyncio.get_running_loop()
    body = {"model": route, "messages": salted(req.messages, salt), "max_tokens": req.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = loop.time()
    result.sent_s = sent - t0
    try:
        await _stream(client, body, result, sent, timeout, loop)
    except TimeoutError:
        result.error = "timeout"
    except httpx.TimeoutException:
        result.error = "timeout"
    except httpx.TransportError as exc:
        result.error, result.error_detail = "connection", f"{type(exc).__name__}: {exc}"[:200]
    except ValueError:  # a data line that is not JSON
        result.error = "bad_stream"
    finally:  # any outcome, a cancellation included: when it ended
        result.ended_s = loop.time() - t0


async def _stream(client: Any, body: dict[str, Any], result: RequestResult, sent: float, timeout: float,
                  loop: asyncio.AbstractEventLoop) -> None:
    last = None
    chunks = 0
    usage: dict[str, Any] | None = None
    async with asyncio.timeout(timeout), client.stream("POST", "/v1/chat/completions", json=body) as resp:
        result.upstream = resp.headers.get("x-oculis-upstream")
        result.simulated = resp.headers.get("x-oculis-simulated") == "true"
        if resp.status_code != 200:
            result.error = f"http_{resp.status_code}"
            result.error_detail = error_text(await resp.aread())
            return
        finished = False
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                finished = True
                break
            chunk = json.loads(data)
            if not isinstance(chunk, dict) or "error" in chunk:
                result.error = "stream_error"
                result.error_detail = error_text(data.encode())
                return
            if chunk.get("system_fingerprint") == SIM_FINGERPRINT:
                result.simulated = True
            if isinstance(chunk.get("usage"), dict):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or choice.get("text"):
                    now = loop.time()
                    if last is None:
                        result.ttft_s = now - sent
                    else:
                        result.itl_s.append(now - last)
                    last = now
                    chunks += 1
        if not finished:
            result.error = "stream_cut"  # the body ended without [DONE]
            return
    result.e2e_s = loop.time() - sent
    result.ok = True
    from oculis_router.usage import Usage

    u = Usage.parse(usage)
    if u is None:  # no usage came with the answer: estimated, never 0 prompt tokens (and counted as such)
        result.usage_estimated = True
        words = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
        u = Usage(words, chunks, 0, 0)  # the workloads' words are about one token each
    result.output_tokens = u.completion
    result.prompt_tokens = u.prompt
    result.cached_tokens = u.cached
    result.usage = u  # priced after the run, in one place


Progress = Callable[[float, int, int, int, str], None]  # elapsed, sent, done, in flight, phase


async def run_load(plan: LoadPlan, wl: Workload, progress: Progress) -> LoadResult:
    import httpx

    warmup, duration = plan.warmup_s, plan.duration_s
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1000)
    results: list[RequestResult] = []
    finished: list[tuple[bool, str | None]] = []  # (ok, error kind) in completion order
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    abort = asyncio.Event()
    out = LoadResult(results, time.time())
    async with httpx.AsyncClient(base_url=api_base(plan.url), headers=plan.headers, limits=limits,
                                 timeout=httpx.Timeout(plan.timeout_s, connect=10)) as client:
        t0 = loop.time()
        out.wall_start = time.time()
        end = t0 + warmup + duration

        def note(r: RequestResult) -> None:
            if r.ok or r.error:
                finished.append((r.ok, r.error))
                if not abort.is_set() and (kind := early_failure(finished)) is not None:
                    out.aborted = kind
                    abort.set()

        def spawn(i: int, scheduled: float | None) -> asyncio.Task[None]:
            r = RequestResult(index=i, sent_s=loop.time() - t0, scheduled_s=scheduled)
            r.warmup = r.sent_s < warmup
            results.append(r)
            task = asyncio.create_task(one_request(client, plan.route, wl.requests[i % len(wl.requests)], r, t0,
                                                   plan.timeout_s, plan.salt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(lambda _t, r=r: note(r))  # type: ignore[misc]
            return task

        async def pause(delay: float) -> None:
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(abort.wait(), delay)

        async def ticker() -> None:
            while True:
                now = loop.time()
                progress(now - t0, len(results), len(finished), len(tasks), "warm-up" if now - t0 < warmup
                         else "measuring" if now < end else "draining")
                await asyncio.sleep(0.25)
                if t0 + warmup <= now < end:
                    out.loop_lag_s.append(max(0.0, loop.time() - now - 0.25))

        tick = asyncio.create_task(ticker())
        try:
            if wl.arrivals is not None:
                for i, due in enumerate(wl.arrivals):
                    await pause(t0 + due - loop.time())
                    if abort.is_set():
                        break
                    spawn(i, due)
            else:
                counter = itertools.count()

                async def worker() -> None:
                    while loop.time() < end and not abort.is_set():
                        await spawn(next(counter), None)

                await asyncio.gather(*(worker() for _ in range(plan.concurrency or 1)))
            pending = set(tasks)
            if pending and not abort.is_set():
                _, pending = await asyncio.wait(pending, timeout=plan.drain_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        finally:
            tick.cancel()
    for r in results:
        if not r.ok and r.error is None:
            r.cancelled = True  # still in flight when the drain timed out (or the run stopped)
    return out
