"""`oculis sim serve`: the engine core on the wall clock behind an OpenAI-compatible HTTP server.

One asyncio task runs the engine: it plans a step, sleeps until the step's modelled end, then writes
every emitted token straight to its stream, so tokens leave at the modelled inter-token latency.
Honesty: every response has `x-oculis-simulated: true`, bodies carry `system_fingerprint:
"oculis-simulator"`, models are `owned_by: oculis-simulator`, and the text is placeholder words, one
per token, so `usage.completion_tokens` equals the word count. /metrics uses vLLM V1's names and buckets.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import heapq
import itertools
import json
import re
import sys
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from oculis_sim import FINGERPRINT
from oculis_sim.config import Settings
from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import BLOCK, Request

HEADER = "x-oculis-simulated"
_LOREM = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
          "dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip ex ea "
          "commodo consequat")
WORDS = tuple(_LOREM.split())
_TOKEN = re.compile(r"\w+|[^\w\s]")
TEMPLATE_TOKENS_PER_MESSAGE = 4  # role markers of a chat template (approximation; no real tokenizer here)
# vLLM V1 buckets (vllm/v1/metrics/loggers.py; ../shared/notes/simulator.md section 6)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                   480.0, 960.0, 1920.0, 7680.0)
LATENESS_SAMPLES = 1 << 18
SLOW_CLIENT_BYTES = 8 << 20


def token_count(text: str) -> int:
    return len(_TOKEN.findall(text))


def prompt_tokens(text_parts: list[str]) -> list[str]:
    out: list[str] = []
    for part in text_parts:
        out.extend(_TOKEN.findall(part))
    return out


def block_hashes(tokens: list[str]) -> tuple[object | None, ...]:
    """Chained hashes of full 16-token blocks, as vLLM's prefix cache keys them."""
    out: list[object | None] = []
    h = 0
    for i in range(len(tokens) // BLOCK):
        h = hash((h, *tokens[i * BLOCK:(i + 1) * BLOCK]))
        out.append(h)
    return tuple(out)


def placeholder(n: int, start: int = 0) -> list[str]:
    return [WORDS[(start + i) % len(WORDS)] for i in range(n)]


def error_body(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    """vLLM's error shape (OpenAI's): {"error": {message, type, param, code}}."""
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": status}},
                             status=status)


class Metrics:
    def __init__(self, s: Settings) -> None:
        self.registry = r = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.labels = (s.served_names[0], "0")
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch", lab, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting", lab, registry=r)
        self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage (1 = 100 %)", lab, registry=r)
        info = Gauge("vllm:cache_config_info", "KV cache configuration", ["block_size", "num_gpu_blocks",
                     "gpu_memory_utilization", "cache_dtype", "enable_prefix_caching"], registry=r)
        info.labels(str(BLOCK), str(s.num_blocks), f"{s.gpu_memory_utilization:g}", s.kv_cache_dtype,
                    str(s.prefix_caching)).set(1)
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions", lab, registry=r)
        self.prompt = Counter("vllm:prompt_tokens", "Prefill tokens processed", lab, registry=r)
        self.generation = Counter("vllm:generation_tokens", "Generation tokens processed", lab, registry=r)
        self.queries = Counter("vllm:prefix_cache_queries", "Prefix-cache queries (tokens)", lab, registry=r)
        self.hits = Counter("vllm:prefix_cache_hits", "Prefix-cache hits (tokens)", lab, registry=r)
        self.success = Counter("vllm:request_success", "Finished requests", [*lab, "finished_reason"], registry=r)
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Speculative drafts", lab, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens", lab, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens", lab, registry=r)
        self.per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens per position",
                               [*lab, "position"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT", lab, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "ITL", lab, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "End-to-end latency", lab, buckets=LATENCY_BUCKETS,
                             registry=r)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Time waiting", lab, buckets=LATENCY_BUCKETS,
                               registry=r)
        tok_buckets = [b * m for m in (1, 10, 100, 1000, 10000, 100000) for b in (1, 2, 5) if b * m <= s.max_model_len]
        self.req_prompt = Histogram("vllm:request_prompt_tokens", "Prompt tokens per request", lab,
                                    buckets=tok_buckets, registry=r)
        self.req_gen = Histogram("vllm:request_generation_tokens", "Generated tokens per request", lab,
                                 buckets=tok_buckets, registry=r)
        for m in (self.running, self.waiting, self.kv, self.preemptions, self.prompt, self.generation, self.queries,
                  self.hits, self.drafts, self.draft_tokens, self.accepted):
            m.labels(*self.labels)
        self.k = s.spec.num_speculative_tokens if s.spec else 0
        for i in range(self.k):
            self.per_pos.labels(*self.labels, str(i))
        self.seen: dict[str, int] = {}

    def sync(self, core: EngineCore) -> None:
        """Counters follow the engine's totals (increments of the difference)."""
        c = core.counters
        lab = self.labels
        for name, metric, value in (("pre", self.preemptions, c.preemptions), ("pt", self.prompt, c.prompt_tokens),
                                    ("gt", self.generation, c.generation_tokens), ("q", self.queries, c.prefix_queries),
                                    ("h", self.hits, c.prefix_hits), ("d", self.drafts, c.spec_drafts),
                                    ("dt", self.draft_tokens, c.spec_draft_tokens),
                                    ("a", self.accepted, c.spec_accepted)):
            delta = value - self.seen.get(name, 0)
            if delta:
                metric.labels(*lab).inc(delta)
                self.seen[name] = value
        for i, v in enumerate(c.spec_accepted_per_pos):
            key = f"p{i}"
            delta = v - self.seen.get(key, 0)
            if delta:
                self.per_pos.labels(*lab, str(i)).inc(delta)
                self.seen[key] = v
        sched = core.scheduler
        self.running.labels(*lab).set(len(sched.running))
        self.waiting.labels(*lab).set(len(sched.waiting))
        self.kv.labels(*lab).set(sched.usage())


class Stream:
    """One request's client side: where its tokens go and what it has been sent."""

    __slots__ = ("arrival", "chat", "created", "done", "finish_reason", "head", "id", "model", "pos", "prompt_len",
                 "req", "resp", "stream", "tail", "transport", "usage", "word0")

    def __init__(self, chat: bool, model: str, stream: bool, resp: web.StreamResponse | None, prompt_len: int,
                 finish_reason: str, usage: bool, arrival: float) -> None:
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = model
        self.stream = stream
        self.resp = resp
        self.prompt_len = prompt_len
        self.finish_reason = finish_reason
        self.usage = usage
        self.arrival = arrival
        self.pos = 0
        self.word0 = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.req: Request | None = None
        self.transport: asyncio.Transport | None = None
        # A token chunk is head + words + tail: placeholder words need no JSON escaping, so the hot path
        # (256 streams x every step) only concatenates bytes.
        head, _, tail = self.chunk("\x00").partition(b"\\u0000")
        self.head, self.tail = head, tail

    def chunk(self, text: str, finish: str | None = None, role: bool = False) -> bytes:
        fin = "null" if finish is None else f'"{finish}"'
        if self.chat:
            delta = ('{"role":"assistant","content":""}' if role else json.dumps({"content": text}))
            choice = f'{{"index":0,"delta":{delta},"logprobs":null,"finish_reason":{fin}}}'
            obj = "chat.completion.chunk"
        else:
            choice = f'{{"index":0,"text":{json.dumps(text)},"logprobs":null,"finish_reason":{fin}}}'
            obj = "text_completion"
        return (f'data: {{"id":"{self.id}","object":"{obj}","created":{self.created},"model":{json.dumps(self.model)},'
                f'"system_fingerprint":"{FINGERPRINT}","choices":[{choice}]}}\n\n').encode()

    def usage_obj(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_len, "completion_tokens": self.pos,
                "total_tokens": self.prompt_len + self.pos}


class SimServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.core = EngineCore(settings)
        self.metrics = Metrics(settings)
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
                if isinstance(req.sink, Stream) and not req.sink.done.done():
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
            if not res.plan.scheduled:  # cannot happen while max_model_len fits the cache; never spin on it
                raise RuntimeError("engine made no progress: a request needs more KV blocks than exist")
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

    async def _deliver(self, emitted: list[tuple[Request, int]], finished: list[Request], due: float) -> None:
        clock = asyncio.get_running_loop().time
        m = self.metrics
        lab = m.labels
        itl = m.itl.labels(*lab)
        ttft = m.ttft.labels(*lab)
        done = {id(r) for r in finished}
        for req, n in emitted:
            st = req.sink
            assert isinstance(st, Stream)
            if n == 1:
                text = (" " if st.pos else "") + WORDS[(st.word0 + st.pos) % len(WORDS)]
            else:
                text = (" " if st.pos else "") + " ".join(placeholder(n, st.word0 + st.pos))
            first = st.pos == 0
            st.pos += n
            if req.first_token < 0:
                req.first_token = due
                ttft.observe(due - st.arrival)
            else:
                itl.observe(due - req.last_token)
            req.last_token = due
            if st.stream and st.resp is not None:
                data = (st.chunk(text, st.finish_reason) if id(req) in done
                        else b"".join((st.head, text.encode(), st.tail)))
                if first and st.chat:  # vLLM sends the role chunk with the first token, not before it
                    data = st.chunk("", role=True) + data
                try:
                    await self._send(st, data)
                except (ConnectionError, RuntimeError):
                    self.core.scheduler.abort(req)
                    if not st.done.done():
                        st.done.set_result(None)
                    continue
            late = abs(clock() - due)  # early counts as much as late
            self.lateness[self.late_n % LATENESS_SAMPLES] = late
            self.late_n += 1
            if late > self.late_max:
                self.late_max = late
        for req in finished:
            st = req.sink
            assert isinstance(st, Stream)
            m.e2e.labels(*lab).observe(due - st.arrival)
            m.req_prompt.labels(*lab).observe(st.prompt_len)
            m.req_gen.labels(*lab).observe(st.pos)
            m.success.labels(*lab, st.finish_reason).inc()
            if not st.done.done():
                st.done.set_result(None)

    # ---- HTTP ----------------------------------------------------------------------------------------
    def served(self, model: Any) -> str | None:
        names = self.settings.served_names
        if model is None:
            return names[0]
        return model if model in names else None

    async def completions(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival = asyncio.get_running_loop().time()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_body(400, "The request body is not valid JSON.")
        if not isinstance(body, dict):
            return error_body(400, "The request body must be a JSON object.")
        model = self.served(body.get("model"))
        if model is None:
            return error_body(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs:
                return error_body(400, "messages: a non-empty list of {role, content} is required")
            parts: list[str] = []
            for msg in msgs:
                content = msg.get("content") if isinstance(msg, dict) else None
                if isinstance(content, list):
                    content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                parts.append(f"{msg.get('role', '') if isinstance(msg, dict) else ''} {content or ''}")
            toks = prompt_tokens(parts)
            n_prompt = len(toks) + TEMPLATE_TOKENS_PER_MESSAGE * len(msgs)
        else:
            prompt = body.get("prompt")
            if isinstance(prompt, list) and len(prompt) == 1:
                prompt = prompt[0]
            if isinstance(prompt, list) and all(isinstance(x, int) for x in prompt):
                toks = [str(x) for x in prompt]
            elif isinstance(prompt, str):
                toks = prompt_tokens([prompt])
            else:
                return error_body(400, "prompt: a string (or one list of token ids) is required")
            n_prompt = max(1, len(toks))
        if body.get("n", 1) != 1:
            return error_body(400, "n: only n = 1 is simulated")
        limit = self.settings.max_model_len
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                       or max_tokens < 1):
            return error_body(400, f"max_tokens must be at least 1, got {max_tokens}.")
        if n_prompt >= limit:
            return error_body(400, f"This model's maximum context length is {limit} tokens. However, your request "
                              f"has {n_prompt} input tokens. Please reduce the length of the input messages.")
        if max_tokens is not None and n_prompt + max_tokens > limit:
            return error_body(400, f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                              f"maximum context length is {limit} tokens and your request has {n_prompt} input "
                              f"tokens ({max_tokens} > {limit} - {n_prompt}).")
        if max_tokens is None:  # the simulated EOS: a natural length, as a model would stop by itself
            out, reason = min(int(self.rng.lognormal(5.2, 0.6)) + 1, limit - n_prompt), "stop"
        else:
            out, reason = max_tokens, "length"
        word0 = int(self.rng.integers(len(WORDS)))
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [s for s in stop or [] if isinstance(s, str) and s]
        if stops:
            words = placeholder(out, word0)
            text = " ".join(words)
            cut = min((p for p in (text.find(s) for s in stops) if p >= 0), default=-1)
            if cut >= 0:
                out, reason = len(text[:cut].split(" ")) - (1 if text[:cut].endswith(" ") or cut == 0 else 0), "stop"
                out = max(out, 0)
        stream = bool(body.get("stream"))
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage")) if isinstance(opts, dict) else False
        resp: web.StreamResponse | None = None
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               HEADER: "true"})
            await resp.prepare(request)
            # vLLM's headers leave at once and the role chunk with the first token; aiohttp would hold
            # the headers until the first body write, so flush them (guarded: a private writer API).
            send_headers = getattr(getattr(resp, "_payload_writer", None), "send_headers", None)
            if callable(send_headers):
                send_headers()
        st = Stream(chat, model, stream, resp, n_prompt, reason, include_usage, arrival)
        st.word0 = word0
        st.transport = request.transport
        if out > 0:
            req = Request(next(self.seq), n_prompt, out, arrival, block_hashes(toks), st)
            st.req = req
            heapq.heappush(self.pending, (arrival + self.core.cost.api_s, req.rid, req))
            self.wake.set()
            try:
                await st.done
            except asyncio.CancelledError:
                self.core.scheduler.abort(req)
                raise
        elif stream:  # stopped before the first word: the role (chat) and the finish reason
            await self._safe_write(st, (st.chunk("", role=True) if chat else b"") + st.chunk("", reason))
        if stream:
            assert resp is not None
            if include_usage:
                usage = json.dumps({"id": st.id, "object": "chat.completion.chunk" if chat else "text_completion",
                                    "created": st.created, "model": model, "system_fingerprint": FINGERPRINT,
                                    "choices": [], "usage": st.usage_obj()})
                await self._safe_write(st, f"data: {usage}\n\n".encode())
            await self._safe_write(st, b"data: [DONE]\n\n")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await resp.write_eof()
            return resp
        text = " ".join(placeholder(st.pos, word0))
        if chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return web.json_response({"id": st.id, "object": "chat.completion" if chat else "text_completion",
                                  "created": st.created, "model": model, "system_fingerprint": FINGERPRINT,
                                  "choices": [choice], "usage": st.usage_obj()})

    @staticmethod
    async def _send(st: Stream, data: bytes) -> None:
        """Write without waiting for the client to read: one slow reader must not stall every stream's
        engine step (aiohttp's write() drains when its buffer passes 64 KiB). A reader more than
        SLOW_CLIENT_BYTES behind is cut off, as a stuck TCP peer would be."""
        assert st.resp is not None
        transport = st.transport
        if transport is not None and transport.get_write_buffer_size() > SLOW_CLIENT_BYTES:
            transport.close()
            raise ConnectionError("client is not reading")
        writer = getattr(st.resp, "_payload_writer", None)
        if writer is not None and "drain" in getattr(writer.write, "__kwdefaults__", {}):
            await writer.write(data, drain=False)
        else:
            await st.resp.write(data)

    @staticmethod
    async def _safe_write(st: Stream, data: bytes) -> None:
        if st.resp is not None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await st.resp.write(data)

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": now, "owned_by": FINGERPRINT, "root": self.settings.model_name,
             "parent": None, "max_model_len": self.settings.max_model_len} for name in self.settings.served_names]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.dead else 200)

    async def metrics_view(self, request: web.Request) -> web.Response:
        self.metrics.sync(self.core)
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(self, request: web.Request) -> web.Response:
        """The simulator's own timing: |send time - modelled step end| of recent tokens."""
        n = min(self.late_n, LATENESS_SAMPLES)
        lat = self.lateness[:n] * 1000
        p50, p90, p99, p999 = (np.percentile(lat, [50, 90, 99, 99.9]).tolist() if n else [0.0] * 4)
        within = float((lat <= 5.0).mean()) if n else 1.0
        return web.json_response({"simulated": True, "tokens": self.late_n, "steps": self.core.counters.steps,
                                  "lateness_ms": {"p50": p50, "p90": p90, "p99": p99, "p99.9": p999,
                                                  "max": self.late_max * 1000, "share_within_5ms": within}})


@web.middleware
async def honesty(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                  ) -> web.StreamResponse:
    resp = await handler(request)
    if not resp.prepared:
        resp.headers[HEADER] = "true"
    return resp


def build_app(settings: Settings) -> web.Application:
    disable_created_metrics()  # type: ignore[no-untyped-call]  # vLLM exports no `_created` series
    sim = SimServer(settings)
    app = web.Application(middlewares=[honesty], client_max_size=64 * 2**20)

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
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/ping", sim.health)
    app.router.add_get("/metrics", sim.metrics_view)
    app.router.add_get("/sim/stats", sim.stats)
    app["sim"] = sim
    return app


def startup_lines(s: Settings) -> list[str]:
    """What vLLM logs at start (the lines tools grep for), marked as simulated."""
    return [
        f"oculis sim serve: SIMULATED vLLM engine (oculis-simulator, no GPU): {s.model_name} on {s.gpu.key} x{s.tp}; "
        f"max_num_seqs {s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}, "
        f"max_model_len {s.max_model_len}",
        f"INFO (simulated) GPU KV cache size: {s.kv_cache_tokens:,} tokens",
        f"INFO (simulated) Maximum concurrency for {s.max_model_len:,} tokens per request: "
        f"{s.kv_cache_tokens / s.max_model_len:.2f}x",
    ]


async def log_stats(sim: SimServer, interval: float = 10.0) -> None:
    """vLLM's periodic engine line (vllm#37307 wording), while there is traffic."""
    c = sim.core.counters
    last = (c.prompt_tokens, c.generation_tokens, c.prefix_queries, c.prefix_hits)
    while True:
        await asyncio.sleep(interval)
        now = (c.prompt_tokens, c.generation_tokens, c.prefix_queries, c.prefix_hits)
        sched = sim.core.scheduler
        if now == last and not sched.has_work():
            continue
        queries = now[2] - last[2]
        hit = (now[3] - last[3]) / queries if queries else 0.0
        print(f"INFO (simulated) Engine 000: Avg prompt throughput: {(now[0] - last[0]) / interval:.1f} tokens/s, "
              f"Avg generation throughput: {(now[1] - last[1]) / interval:.1f} tokens/s, Running: "
              f"{len(sched.running)} reqs, Waiting: {len(sched.waiting)} reqs, GPU KV cache usage: "
              f"{sched.usage():.1%}, Prefix cache hit rate: {hit:.1%}", file=sys.stderr, flush=True)
        last = now


def serve(settings: Settings, host: str, port: int) -> None:
    for line in startup_lines(settings):
        print(line, file=sys.stderr, flush=True)
    app = build_app(settings)

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
