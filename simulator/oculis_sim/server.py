"""`oculis sim serve`: the engine core on the wall clock behind vLLM 0.32's OpenAI-compatible HTTP API.

One asyncio task runs the engine: it plans a step, sleeps until the step's modelled end, then writes
every emitted token straight to its stream, so tokens leave at the modelled inter-token latency.
Request checks and refusals: `api_request`; bodies and chunks: `openai_shapes`; logprob values:
`logprobs`; /metrics: `metrics`; the other endpoints (/tokenize, /version, ...): `endpoints`.
Honesty: every response has `x-oculis-simulated: true`, bodies carry `system_fingerprint:
"oculis-simulator"` where vLLM has the key, models are `owned_by: oculis-simulator`, and the text is
placeholder words, one per token, so `usage.completion_tokens` equals the word count.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import itertools
import json
import sys
import traceback
from collections.abc import Awaitable, Callable

import numpy as np
from aiohttp import web

from oculis_sim import openai_shapes as shapes
from oculis_sim.api_request import ApiError, Prompt, json_error, parse
from oculis_sim.calls import Call, Choice
from oculis_sim.config import Settings
from oculis_sim.engine import EngineCore
from oculis_sim.engine_log import log_stats, startup_lines
from oculis_sim.kvevents import Publisher
from oculis_sim.lora import Adapters
from oculis_sim.lora import add_routes as lora_routes
from oculis_sim.metrics import Finished, Metrics
from oculis_sim.scheduler import Request
from oculis_sim.tokens import WORDS, answer_tokens, block_hashes, placeholder

HEADER = "x-oculis-simulated"
LATENESS_SAMPLES = 1 << 18
SLOW_CLIENT_BYTES = 8 << 20
DISCONNECT_POLL_S = 0.2  # how often a non-streamed request checks that its client is still there


def error_response(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


class SimServer:
    def __init__(self, settings: Settings, kv: Publisher | None = None) -> None:
        self.settings = settings
        self.core = EngineCore(settings)
        self.kv = kv  # --kv-events-config: the engine's KV events (kvevents.py)
        if kv is not None:
            kv.attach(self.core)
        self.metrics = Metrics(settings)
        self.lora: Adapters | None = None  # --enable-lora: the adapters it serves (lora.py)
        self.pending: list[tuple[float, int, Request]] = []  # (time the scheduler may see it, seq, request)
        self.seq = itertools.count()
        self.wake = asyncio.Event()
        self.lateness = np.zeros(LATENESS_SAMPLES)
        self.late_n = 0
        self.late_max = 0.0
        self.rng = np.random.default_rng(settings.seed)
        self.task: asyncio.Task[None] | None = None
        self.deliver_s = 0.0  # recent time one step's deliveries take (moving average)
        self.dead = False
        self.in_flight = 0

    # ---- engine loop -------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug in the engine: say so and answer /health 503, as a dead vLLM engine does
            self.dead = True
            traceback.print_exc()
            sched = self.core.scheduler
            for req in [*(r for _, _, r in self.pending), *sched.running, *sched.waiting]:
                if isinstance(req.sink, Choice) and not req.sink.done.done():
                    req.sink.done.set_result(None)
            raise

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time
        core = self.core
        t = clock()
        while True:
            now = clock()
            while self.pending and self.pending[0][0] <= now:
                req = heapq.heappop(self.pending)[2]
                if not req.finished:  # its client left while it waited for the API-server delay
                    core.add(req)
            if not core.has_work():
                self.metrics.sync(core)
                timeout = self.pending[0][0] - now if self.pending else None
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout)
                t = clock()
                continue
            # continuously busy: the next step starts where the last one ended (the modelled schedule);
            # after idling, or if we fell far behind, it starts now.
            start = t if now - t < 0.05 else now
            res = core.step(start)
            if not res.plan.scheduled:  # one request cannot kill the loop: refuse it, the others go on
                stuck = core.scheduler.refuse_unfittable()
                if stuck is not None:
                    self._refuse(stuck, res.end)
                elif not res.plan.preempted:  # nothing changed (a bug): never spin on it, never hang the rest
                    print("oculis sim serve: a step scheduled nothing; retrying", file=sys.stderr, flush=True)
                    await asyncio.sleep(0.01)
                t = res.end
                continue
            self._admitted(res.plan.admitted, res.plan.scheduled, res.start)  # an idle core starts at the arrival
            if self.kv is not None:
                self.kv.publish(core)
            t = res.end
            # Writing a step's tokens takes time (~15 us each); start half of it early so the sends
            # straddle the modelled step end instead of all trailing it.
            delay = t - self.deliver_s / 2 - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            began = clock()
            await self._deliver(res.emitted, res.finished, t)
            self.deliver_s = 0.8 * self.deliver_s + 0.2 * min(clock() - began, 0.02)
            self.metrics.sync(core)

    def _admitted(self, admitted: list[Request], scheduled: list[tuple[Request, int]], start: float) -> None:
        """Queue time ends when a sequence is first scheduled; what it found in the prefix cache then."""
        self.metrics.step(sum(n for _, n in scheduled))
        if not admitted:
            return
        new = {id(r): n for r, n in scheduled}
        for req in admitted:
            ch = req.sink
            if isinstance(ch, Choice) and ch.scheduled is None:
                ch.scheduled = start
                ch.cached = max(0, req.num_computed - new.get(id(req), 0))

    async def _deliver(self, emitted: list[tuple[Request, int]], finished: list[Request], due: float) -> None:
        clock = asyncio.get_running_loop().time
        m = self.metrics
        lab = m.labels
        itl = m.itl.labels(*lab)
        ttft = m.ttft.labels(*lab)
        done = {id(r) for r in finished}
        mean = self.settings.mean_logprob
        for req, n in emitted:
            ch = req.sink
            assert isinstance(ch, Choice)
            call = ch.call
            if req.first_token < 0:
                req.first_token = due
                ttft.observe(due - call.arrival)
            else:
                itl.observe(due - req.last_token)
            req.last_token = due
            if call.gen.stream and call.resp is not None:
                first = ch.pos == 0
                fin = ch.finish_reason if id(req) in done else None
                if call.gen.logprobs is None and fin is None and not (first and call.gen.echo):
                    text = " ".join(placeholder(n, ch.word0 + ch.pos))
                    data = b"".join((ch.head, b" " if ch.pos else b"", text.encode(), ch.tail))
                else:
                    toks = ch.tokens(n)
                    text = "".join(toks)
                    if first and call.gen.echo:
                        text = ch.prompt.text + text
                    data = shapes.event(shapes.chunk(call.chat, call.id, call.created, call.model, ch.index, text, fin,
                                                     ch.logprobs(toks, mean), last=not call.gen.include_usage))
                if call.chat and not call.roles_sent:  # the role chunks go with the first token, not before it
                    data = call.roles() + data
                ch.pos += n
                try:
                    await self._send(call, data)
                except (ConnectionError, RuntimeError):
                    self._abort(call)
                    continue
            else:
                ch.pos += n
            late = abs(clock() - due)  # early counts as much as late
            self.lateness[self.late_n % LATENESS_SAMPLES] = late
            self.late_n += 1
            if late > self.late_max:
                self.late_max = late
        for req in finished:
            ch = req.sink
            assert isinstance(ch, Choice)
            self._observe(ch, req, due)
            if not ch.done.done():
                ch.done.set_result(None)

    def _observe(self, ch: Choice, req: Request, end: float) -> None:
        call = ch.call
        first = req.first_token if req.first_token >= 0 else end
        scheduled = ch.scheduled if ch.scheduled is not None else first
        self.metrics.finished(Finished(
            reason=ch.finish_reason, arrival=call.arrival, scheduled=scheduled, first_token=first, last_token=end,
            prompt_tokens=ch.prompt.n, cached_tokens=ch.cached, generation_tokens=ch.pos,
            max_tokens=ch.max_output if ch.prompt.max_tokens is None else ch.prompt.max_tokens, n=call.gen.n,
            preemptions=req.preemptions))

    def _refuse(self, req: Request, end: float) -> None:
        """A sequence that needs more KV blocks than the cache has: it ends now (finish reason abort, as vLLM
        ends a request it drops) instead of hanging every request behind it."""
        ch = req.sink
        req.max_output = req.num_output
        if isinstance(ch, Choice) and not ch.done.done():
            ch.finish_reason = "abort"
            self._observe(ch, req, end)
            ch.done.set_result(None)

    def _abort(self, call: Call) -> None:
        """The client left: stop generating for it (vLLM aborts the request) and count it as aborted."""
        end = asyncio.get_running_loop().time()
        for ch in call.choices:
            if ch.done.done():
                continue
            if ch.req is not None and not ch.req.finished:
                self.core.scheduler.abort(ch.req)
                ch.finish_reason = "abort"
                self._observe(ch, ch.req, end)
            ch.done.set_result(None)

    # ---- HTTP ----------------------------------------------------------------------------------------
    def _length(self, prompt: Prompt, rng: np.random.Generator) -> tuple[int, str]:
        """Tokens to generate and why it stops: max_tokens, or (none given) a natural length."""
        cap = self.settings.max_model_len - prompt.n
        if prompt.max_tokens is not None:
            return prompt.max_tokens, "length"
        natural = int(rng.lognormal(5.2, 0.6)) + 1  # the simulated EOS
        return (natural, "stop") if natural < cap else (cap, "length")

    @staticmethod
    def _stop_cut(stops: tuple[str, ...], out: int, word0: int) -> int | None:
        """Tokens before the first stop string in the answer, or None."""
        text = " ".join(placeholder(out, word0))
        cut = min((p for p in (text.find(s) for s in stops) if p >= 0), default=-1)
        if cut < 0:
            return None
        return max(0, len(text[:cut].split(" ")) - (1 if text[:cut].endswith(" ") or cut == 0 else 0))

    def _choice(self, call: Call, index: int, prompt: Prompt, hashes: tuple[object | None, ...],
                rng: np.random.Generator, arrival: float) -> None:
        """One sequence of the call, handed to the engine after the API server's delay."""
        gen = call.gen
        out, reason = self._length(prompt, rng)
        word0 = int(rng.integers(len(WORDS)))
        if gen.stops and (cut := self._stop_cut(gen.stops, out, word0)) is not None:
            out, reason = cut, "stop"
        ch = Choice(call, index, prompt, out, reason, word0)
        call.choices.append(ch)
        if out > 0:
            req = Request(next(self.seq), prompt.n, out, arrival, hashes, ch, gen.priority)
            ch.req = req
            heapq.heappush(self.pending, (arrival + self.core.cost.api_s, req.rid, req))
        else:
            ch.done.set_result(None)

    async def completions(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return error_response(json_error(exc))
        except UnicodeDecodeError:
            return error_response(json_error(json.JSONDecodeError("invalid UTF-8", "", 0)))
        names, lora = self.settings.served_names, self.lora
        adapter = body.get("model") if lora and isinstance(body, dict) and body.get("model") in lora.modules else None
        try:
            gen = parse(body, chat, names + ((adapter,) if adapter else ()), self.settings.max_model_len,
                        request.headers.get("X-Request-Id"), self.settings.scheduling_policy == "priority")
        except ApiError as err:
            return error_response(err)
        seed = (self.settings.seed, gen.seed) if gen.seed is not None else (self.settings.seed, next(self.seq))
        rng = np.random.default_rng([abs(x) for x in seed])
        resp: web.StreamResponse | None = None
        if gen.stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                               "Cache-Control": "no-cache", HEADER: "true"})
            await resp.prepare(request)
            # vLLM's headers leave at once and the role chunk with the first token; aiohttp would hold
            # the headers until the first body write, so flush them (guarded: a private writer API).
            send_headers = getattr(getattr(resp, "_payload_writer", None), "send_headers", None)
            if callable(send_headers):
                send_headers()
        call = Call(gen, adapter or names[0], resp, arrival, seed)  # vLLM answers with the first served name
        call.transport = request.transport
        self.in_flight += 1
        try:
            if adapter and lora:
                await lora.acquire(adapter)
            for p, prompt in enumerate(gen.prompts):  # vLLM runs each prompt n times; choice p * n + i
                hashes = block_hashes(prompt.tokens, self.settings.block_size)
                if self.kv is not None:
                    self.kv.note(hashes, prompt.tokens)
                for i in range(gen.n):
                    self._choice(call, p * gen.n + i, prompt, hashes, rng, arrival)
            self.wake.set()
            await self._wait(call, request)
            for ch in call.choices:
                if ch.req is None and gen.stream:  # stopped before the first word: role and finish reason
                    await self._safe_write(call, (call.roles() if chat and not call.roles_sent else b"")
                                           + shapes.event(shapes.chunk(chat, call.id, call.created, call.model,
                                                                       ch.index, "", ch.finish_reason,
                                                                       last=not gen.include_usage)))
        finally:
            self.in_flight -= 1
            if adapter and lora:
                lora.release(adapter)
        generated = sum(ch.pos for ch in call.choices)
        cached = min(ch.cached for ch in call.choices) if self.settings.prompt_tokens_details else None
        block = self.settings.block_size
        created = max(0, gen.n_prompt // block * block - (cached or 0)) if self.settings.prefix_caching else 0
        if gen.stream:
            assert resp is not None
            if gen.include_usage:
                await self._safe_write(call, shapes.event(shapes.usage_chunk(
                    chat, call.id, call.created, call.model,
                    shapes.usage(gen.n_prompt, generated, cached, created, streamed=True, chat=chat))))
            await self._safe_write(call, shapes.DONE)
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
            return resp
        mean = self.settings.mean_logprob
        choices = []
        for ch in call.choices:
            toks = answer_tokens(ch.pos, ch.word0)
            text = "".join(toks)
            ch.pos = 0
            logprobs = ch.logprobs(toks, mean)
            if chat:
                choices.append(shapes.chat_choice(ch.index, text, ch.finish_reason, logprobs))
            else:
                prefix = ch.prompt.text if gen.echo else ""
                choices.append(shapes.completion_choice(ch.index, prefix + text, ch.finish_reason, logprobs))
        return web.json_response(shapes.body(chat, call.id, call.created, call.model, choices,
                                             shapes.usage(gen.n_prompt, generated, cached, created, chat=chat)))

    async def _wait(self, call: Call, request: web.Request) -> None:
        """Until every choice is done; a client that leaves a non-streamed request aborts it (vLLM does)."""
        pending = {ch.done for ch in call.choices if not ch.done.done()}
        try:
            while pending:
                _, pending = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
                transport = request.transport
                if pending and (transport is None or transport.is_closing()):
                    self._abort(call)
                    return
        except asyncio.CancelledError:
            self._abort(call)
            raise

    @staticmethod
    async def _send(call: Call, data: bytes) -> None:
        """Write without waiting for the client to read: one slow reader must not stall every stream's
        engine step (aiohttp's write() drains when its buffer passes 64 KiB). A reader more than
        SLOW_CLIENT_BYTES behind is cut off, as a stuck TCP peer would be."""
        assert call.resp is not None
        transport = call.transport
        if transport is not None and transport.get_write_buffer_size() > SLOW_CLIENT_BYTES:
            transport.close()
            raise ConnectionError("client is not reading")
        writer = getattr(call.resp, "_payload_writer", None)
        if writer is not None and "drain" in getattr(writer.write, "__kwdefaults__", {}):
            await writer.write(data, drain=False)
        else:
            await call.resp.write(data)

    @staticmethod
    async def _safe_write(call: Call, data: bytes) -> None:
        if call.resp is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await call.resp.write(data)


@web.middleware
async def honesty(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    try:
        resp = await handler(request)
    except web.HTTPException as exc:  # FastAPI's words for a path or method it has no route for
        if exc.status not in (404, 405):
            raise
        resp = web.json_response({"detail": "Not Found" if exc.status == 404 else "Method Not Allowed"},
                                 status=exc.status)
    if not resp.prepared:
        resp.headers[HEADER] = "true"
    return resp


def build_app(settings: Settings, kv: Publisher | None = None, lora: Adapters | None = None,
              api_keys: list[str] | None = None) -> web.Application:
    from oculis_sim import auth, endpoints

    sim = SimServer(settings, kv)
    sim.lora = lora
    # The key check first, as vLLM's outermost middleware: a refused call never reaches a handler.
    guards = [auth.middleware(api_keys)] if api_keys else []
    app = web.Application(middlewares=[*guards, honesty], client_max_size=64 * 2**20)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await sim.completions(request, chat=True)

    async def completions(request: web.Request) -> web.StreamResponse:
        return await sim.completions(request, chat=False)

    async def start(app: web.Application) -> None:
        gc.freeze()  # start-up objects leave the collector's generations: fewer, shorter pauses under load
        sim.task = asyncio.get_running_loop().create_task(sim.run())

    async def stop(app: web.Application) -> None:
        if sim.task:
            sim.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sim.task

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    endpoints.add_routes(app, sim)
    if lora is not None:
        lora_routes(app, lora, sim.metrics.registry)
    app["sim"] = sim
    return app


def serve(settings: Settings, host: str, port: int, kv: Publisher | None = None, lora: Adapters | None = None,
          api_keys: list[str] | None = None) -> None:
    for line in startup_lines(settings):
        print(line, file=sys.stderr, flush=True)
    app = build_app(settings, kv, lora, api_keys)

    async def start_logger(app: web.Application) -> None:
        app["logger"] = asyncio.get_running_loop().create_task(log_stats(app["sim"]))

    async def stop_logger(app: web.Application) -> None:
        app["logger"].cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await app["logger"]

    app.on_startup.append(start_logger)
    app.on_cleanup.append(stop_logger)
    print(f"oculis sim serve: listening on http://{host}:{port}", file=sys.stderr, flush=True)
    web.run_app(app, host=host, port=port, print=None, access_log=None)
