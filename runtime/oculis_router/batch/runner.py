"""Runs batches: each line through the router's own request path (its route's tiers, cache, limits,
budgets and metering, as the batch's owner) at the batch priority, so it takes only seats no interactive
request waits for (flow control). Lines are recorded once (store.py); a router that restarts resumes its
open batches and skips the lines already recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.responses import Response

from oculis import Pricing
from oculis_router.batch.check import Line, parse_input
from oculis_router.batch.redis_store import LEASE_S, RedisAppender, RedisStore
from oculis_router.batch.store import OWNER, Appender, Store, new_id
from oculis_router.limits import Identity
from oculis_router.usage import Usage, cost_dollars

log = logging.getLogger("oculis.router")
STATUS_POLL_S = 1.0  # how often a running batch re-reads its status (a cancel from another router replica)
SAVE_EVERY_S = 0.5  # a running batch's counts are written at most this often (and at every change of status)
RETRY_CAP_S = 60  # the longest a line waits before trying again after a 429 with Retry-After
# what a line is sent as: (endpoint, body, tenant, who) -> the router's answer
Call = Callable[[str, dict[str, Any], str, Identity], Awaitable[Response]]
FINAL = ("completed", "failed", "expired", "cancelled")
AnyStore = Store | RedisStore
Out = Appender | RedisAppender
WAIT_OTHERS_S = 1.0  # how often a replica with nothing left to claim looks whether the others are done


class BatchMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.lines = Counter("oculis_batch_lines", "Batch lines answered, by route and outcome (ok, error, expired)",
                             ["route", "outcome"], registry=registry)
        self.tokens = Counter("oculis_batch_tokens", "Tokens of batch lines (also in the per-upstream token "
                              "counters): batch spend apart from interactive", ["route", "kind"], registry=registry)
        self.cost = Counter("oculis_batch_cost_dollars", "Estimated cost of batch lines by route and the upstream "
                            "that answered (part of oculis_cost_dollars_total)", ["route", "upstream"],
                            registry=registry)


class Run:
    """One batch being run by this router."""

    def __init__(self, store: AnyStore, batch: dict[str, Any]) -> None:
        self.store, self.batch = store, batch
        owner = batch[OWNER]
        self.tenant = owner["tenant"]
        self.who = Identity(owner["tenant"], owner["key_sha256"], owner["tenant_header"])
        self.cancel = False
        self.read_at = 0.0
        self.saved_at = 0.0
        self.saving = asyncio.Lock()  # one write at a time, in order: an older snapshot never lands last

    async def poll(self) -> None:
        """Reads the stored status at most every STATUS_POLL_S, off the event loop (a cancel from another
        replica); a store that cannot be read now is read again next time."""
        if self.cancel or time.monotonic() - self.read_at < STATUS_POLL_S:
            return
        self.read_at = time.monotonic()
        try:
            stored = await asyncio.to_thread(self.store.batch, self.tenant, self.batch["id"])
        except Exception as exc:
            log.warning("batch %s: cannot read its status from %s: %s", self.batch["id"], self.store.where, exc)
            return
        if stored is not None and stored["status"] == "cancelling":
            self.cancel = True
            self.batch.update(status="cancelling", cancelling_at=stored.get("cancelling_at"))

    async def stopping(self) -> bool:
        """Cancelled (here or by another replica, seen in the store) or past its completion window."""
        await self.poll()
        return self.cancel or time.time() >= self.batch["expires_at"]

    def save(self) -> None:
        self.store.save_batch(self.tenant, self.batch)

    async def save_soon(self) -> None:
        """The counts, written off the event loop and at most every SAVE_EVERY_S (the answers stay fast)."""
        if time.monotonic() - self.saved_at < SAVE_EVERY_S:
            return
        self.saved_at = time.monotonic()
        data = json.dumps(self.batch).encode()
        async with self.saving:
            await asyncio.to_thread(self.store.write_batch, self.tenant, self.batch["id"], data)


class Runner:
    def __init__(self, call: Call, registry: CollectorRegistry,
                 pricing: Callable[[str], Pricing | None] = lambda _: None) -> None:
        self.call = call
        self.pricing = pricing  # an upstream's prices in the config in force (None: unknown)
        self.metrics = BatchMetrics(registry)
        self.runs: dict[str, Run] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.sem: asyncio.Semaphore | None = None
        self.concurrency = 0

    def start(self, store: AnyStore, batch: dict[str, Any], concurrency: int) -> None:
        if batch["id"] in self.runs:
            return
        if self.sem is None or self.concurrency != concurrency:  # the setting changed: new bound for new lines
            self.sem, self.concurrency = asyncio.Semaphore(concurrency), concurrency
        run = Run(store, batch)
        self.runs[batch["id"]] = run
        task = asyncio.get_running_loop().create_task(self._guarded(run))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def resume(self, store: AnyStore, concurrency: int) -> None:
        for b in store.open_batches():
            log.info("batch %s: resuming (%s)", b["id"], b["status"])
            self.start(store, b, concurrency)

    def cancel(self, batch_id: str) -> bool:
        run = self.runs.get(batch_id)
        if run is not None:
            run.cancel = True
        return run is not None

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        for t in list(self.tasks):
            with contextlib.suppress(BaseException):
                await t

    async def _guarded(self, run: Run) -> None:
        try:
            await self._run(run)
        except asyncio.CancelledError:
            raise
        except Exception:  # a store error: the batch stays open and resumes when the router restarts
            log.exception("batch %s stopped on an error; it resumes when the router restarts", run.batch["id"])
        finally:
            self.runs.pop(run.batch["id"], None)

    async def _run(self, run: Run) -> None:
        b, store = run.batch, run.store
        lock = await asyncio.to_thread(store.lock, run.tenant, b["id"])
        if lock is None:
            log.info("batch %s is run by another router replica", b["id"])
            return
        beating = asyncio.get_running_loop().create_task(self._beat(store))
        try:
            data = await asyncio.to_thread(store.input_bytes, run.tenant, b["id"])
            lines = parse_input(data, 1 << 30, 1 << 62)  # checked at creation: these bounds never bite
            done, ok, failed = await asyncio.to_thread(store.recorded, run.tenant, b["id"])
            b["request_counts"] = {"total": len(lines), "completed": ok, "failed": failed}
            if b["status"] == "validating":
                b.update(status="in_progress", in_progress_at=int(time.time()))
            if b["status"] in FINAL:
                return
            await asyncio.to_thread(run.save)
            out = store.appender(run.tenant, b["id"])
            try:
                while True:  # the lines no replica holds; then wait for the others' (or take a dead one's)
                    todo = [ln for ln in lines if ln.custom_id not in done]
                    if not todo or await run.stopping():
                        break
                    ran = await self._lines(run, todo, out)
                    done = (await asyncio.to_thread(store.recorded, run.tenant, b["id"]))[0]
                    if not ran and len(done) < len(lines):
                        await asyncio.sleep(WAIT_OTHERS_S)
            finally:
                out.close()
            while await asyncio.to_thread(store.in_flight, run.tenant, b["id"]):  # other replicas' last lines
                await asyncio.sleep(WAIT_OTHERS_S)
            done = (await asyncio.to_thread(store.recorded, run.tenant, b["id"]))[0]
            if await asyncio.to_thread(store.finisher, run.tenant, b["id"]):
                await asyncio.to_thread(self._finish, run, [ln for ln in lines if ln.custom_id not in done])
        finally:
            beating.cancel()
            lock.close()

    @staticmethod
    async def _beat(store: AnyStore) -> None:
        """Keeps this replica's claims its own while it runs (Redis); a beat that fails is tried again."""
        while True:
            try:
                await asyncio.to_thread(store.beat)
            except Exception as exc:
                log.warning("batch store %s: heartbeat failed: %s", store.where, exc)
            await asyncio.sleep(LEASE_S / 4)

    async def _lines(self, run: Run, todo: list[Line], out: Out) -> int:
        """Runs the lines this replica can claim; how many it ran."""
        assert self.sem is not None
        sem = self.sem
        pending: set[asyncio.Task[None]] = set()
        ran = 0
        try:
            for line in todo:
                if await run.stopping():
                    break
                await sem.acquire()
                if await run.stopping():
                    sem.release()
                    break
                if not await asyncio.to_thread(run.store.claim, run.tenant, run.batch["id"], line.custom_id):
                    sem.release()  # recorded already, or another live replica runs it
                    continue
                ran += 1
                t = asyncio.get_running_loop().create_task(self._line(run, line, out))
                t.add_done_callback(lambda _: sem.release())
                pending.add(t)
                t.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*pending)
        except asyncio.CancelledError:
            for t in pending:
                t.cancel()
            raise
        return ran

    async def _line(self, run: Run, line: Line, out: Out) -> None:
        while True:
            resp = await self.call(line.endpoint, dict(line.body), run.tenant, run.who)
            after = resp.headers.get("retry-after")
            retry = resp.headers.get("x-should-retry") != "false"  # a spent budget says stop, not wait
            if resp.status_code in (429, 503) and retry and after and after.isdigit() and not await run.stopping():
                # the fleet is full (flow control shed it) or a limit says wait: not an answer, try again
                await asyncio.sleep(min(RETRY_CAP_S, max(1, int(after))))
                continue
            break
        try:
            body: Any = json.loads(bytes(resp.body))
        except (ValueError, AttributeError):
            body = {"error": {"message": f"the router answered {resp.status_code} without a JSON body",
                              "type": "server_error", "param": None, "code": None}}
        status = resp.status_code
        kind = "output" if 200 <= status < 300 else "errors"
        # appended and synced in a worker thread: an fsync on the event loop would stall every request
        first = await asyncio.to_thread(out.write, kind, {
            "id": new_id("batch_req_"), "custom_id": line.custom_id, "response": {
                "status_code": status, "request_id": resp.headers.get("x-request-id") or new_id("req_"),
                "body": body}, "error": None})
        if not first:  # another replica recorded this line first (it took over a lease thought dead)
            return
        counts = run.batch["request_counts"]
        counts["completed" if kind == "output" else "failed"] += 1
        route = str(line.body["model"])
        self.metrics.lines.labels(route, "ok" if kind == "output" else "error").inc()
        usage = Usage.parse(body.get("usage") if isinstance(body, dict) else None)
        if usage is not None:
            self.metrics.tokens.labels(route, "prompt").inc(usage.prompt)
            self.metrics.tokens.labels(route, "completion").inc(usage.completion)
            upstream = resp.headers.get("x-oculis-upstream", "-")
            if (prices := self.pricing(upstream)) is not None:
                self.metrics.cost.labels(route, upstream).inc(cost_dollars(prices, usage))
        await run.save_soon()

    def _finish(self, run: Run, left: list[Line]) -> None:
        b, store = run.batch, run.store
        now = int(time.time())
        expired = not run.cancel and bool(left) and time.time() >= b["expires_at"]
        if expired:  # what the window left undone is written as errors, as OpenAI does
            out = store.appender(run.tenant, b["id"])
            try:
                for line in left:
                    out.write("errors", {"id": new_id("batch_req_"), "custom_id": line.custom_id, "response": None,
                                         "error": {"code": "batch_expired", "message": "This request could not be "
                                                   "executed before the completion window expired."}})
                    self.metrics.lines.labels(str(line.body["model"]), "expired").inc()
            finally:
                out.close()
        b.update(status="finalizing", finalizing_at=now)
        run.save()
        for kind, key, purpose in (("output", "output_file_id", "batch_output"), ("errors", "error_file_id",
                                                                                  "batch_output")):
            data = store.result_bytes(run.tenant, b["id"], kind)
            if data and not b.get(key):
                b[key] = store.put_file(run.tenant, f"{b['id']}_{kind}.jsonl", purpose, data)["id"]
        final = "cancelled" if run.cancel else "expired" if expired else "completed"
        _, ok, failed = store.recorded(run.tenant, b["id"])  # every replica's lines
        b["request_counts"].update(completed=ok, failed=failed)
        b.update(status=final, **{f"{final}_at": int(time.time())})
        run.save()
        log.info("batch %s %s: %s", b["id"], final, b["request_counts"])
