"""vLLM V1's scheduler as a deterministic state machine (no I/O, no clock).

Semantics copied from vLLM `vllm/v1/core/sched/scheduler.py` (../shared/notes/simulator.md section 2,
vllm-engine note section 1):
- one token budget per step (`max_num_batched_tokens`); RUNNING requests are scheduled first, in order,
  then WAITING ones while fewer than `max_num_seqs` run; a prompt longer than the remaining budget is
  prefilled in chunks (chunked prefill);
- KV blocks of `block_size` tokens (16 on GPUs, 128 on vLLM's CPU backend); when a running request
  cannot get its blocks, the newest running request is preempted by recompute: all its blocks freed,
  `num_computed_tokens = 0`, prepended to WAITING; no waiting request is admitted in a step that preempted;
- prefix caching: full prompt blocks are hashed; a new request reuses the leading blocks already cached
  (at least one token is always computed); blocks nobody references stay cached until evicted, LRU.
  A preempted request's own cached blocks are dropped (BLIS #1121: keeping them made re-prefill free);
- speculative decoding: a decoding request schedules 1 + k tokens; the engine reports how many of the
  k drafts were accepted, and the rejected ones are un-computed;
- `--scheduling-policy priority` (vLLM's SchedulingPolicy.PRIORITY): WAITING is ordered by (priority,
  arrival), the lower value first (vLLM's PriorityRequestQueue, a preempted request re-enters by the same
  key), and the request preempted when blocks run out is the running one with the largest (priority,
  arrival): `max(self.running, key=lambda r: (r.priority, r.arrival_time))`; one already scheduled in
  the step gives its tokens back to the budget.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

BLOCK = 16
Policy = Literal["fcfs", "priority"]


class Request:
    """One sequence inside the engine. Times are on whatever clock the driver uses."""

    __slots__ = ("arrival", "blocks", "cached_upto", "first_token", "hashes", "last_token", "max_output",
                 "num_computed", "num_output", "preemptions", "priority", "prompt_len", "rid", "shared", "sink",
                 "spec_scheduled", "started")

    def __init__(self, rid: int, prompt_len: int, max_output: int, arrival: float = 0.0,
                 hashes: tuple[object | None, ...] = (), sink: object = None, priority: int = 0) -> None:
        self.rid = rid
        self.priority = priority  # vLLM's request priority: with the priority policy, lower runs first
        self.prompt_len = prompt_len
        self.max_output = max_output  # tokens to generate (the simulated EOS comes after this many)
        self.arrival = arrival
        self.hashes = hashes  # one per full prompt block; None = content nobody else has
        self.sink = sink  # the driver's handle (a stream to write to, a record to fill)
        self.num_computed = 0
        self.num_output = 0
        self.blocks = 0  # blocks held privately
        self.shared: list[object] = []  # hashes of the leading blocks held through the prefix cache
        self.cached_upto = 0  # leading prompt blocks already checked for promotion into the cache
        self.preemptions = 0
        self.spec_scheduled = 0
        self.first_token = -1.0
        self.last_token = -1.0
        self.started = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output

    @property
    def finished(self) -> bool:
        return self.num_output >= self.max_output

    def __repr__(self) -> str:
        return f"Request({self.rid}, computed={self.num_computed}, output={self.num_output})"


class BlockPool:
    """Counts of KV blocks: held privately, cached (referenced or evictable), free."""

    def __init__(self, num_blocks: int) -> None:
        self.total = num_blocks - 1  # vLLM keeps one permanent null block
        self.private = 0
        self.refs: dict[object, int] = {}  # cached block hash -> requests referencing it
        self.evictable: dict[object, None] = {}  # cached, unreferenced, oldest first (dicts keep order)
        self.log: list[tuple[bool, object]] | None = None  # a list: (stored?, hash) as blocks enter/leave the cache

    @property
    def free(self) -> int:
        """Blocks a new allocation can take (evictable cached blocks included)."""
        return self.total - self.private - len(self.refs) + len(self.evictable)

    @property
    def used(self) -> int:
        return self.private + len(self.refs) - len(self.evictable)

    def allocate(self, n: int) -> bool:
        if n <= 0:
            return True
        if n > self.free:
            return False
        spare = self.total - self.private - len(self.refs)
        for _ in range(n - spare):  # evict least recently freed cached blocks
            h = next(iter(self.evictable))
            del self.evictable[h]
            del self.refs[h]
            if self.log is not None:
                self.log.append((False, h))
        self.private += n
        return True

    def ref(self, h: object) -> None:
        n = self.refs[h]
        if n == 0:
            del self.evictable[h]
        self.refs[h] = n + 1

    def unref(self, h: object, drop: bool = False) -> None:
        n = self.refs[h] - 1
        if n > 0:
            self.refs[h] = n
        elif drop:
            del self.refs[h]
            if self.log is not None:
                self.log.append((False, h))
        else:
            self.refs[h] = 0
            self.evictable[h] = None


@dataclass
class StepPlan:
    """What one step computes. `scheduled` pairs a request with its new tokens (drafts included)."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    prefill_tokens: int = 0
    prefill_pairs: float = 0.0
    decode_tokens: int = 0
    decode_pairs: float = 0.0
    context_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0


class Scheduler:
    def __init__(self, num_blocks: int, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 num_speculative_tokens: int = 0, prefix_caching: bool = True, block_size: int = BLOCK,
                 full_sequence_admission: bool = False, policy: Policy = "fcfs") -> None:
        self.pool = BlockPool(num_blocks)
        self.policy = policy
        self.block = block_size
        # vLLM >= 0.19 (scheduler_reserve_full_isl, vllm#37307, default on): a waiting request is admitted only
        # if its whole known sequence fits the free blocks, not just its first chunk (no admit-then-preempt).
        self.full_sequence_admission = full_sequence_admission
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.k = num_speculative_tokens
        self.prefix_caching = prefix_caching
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.preemptions = 0

    def add(self, req: Request) -> None:
        if self.policy == "priority":
            self._enqueue(req)
        else:
            self.waiting.append(req)

    def _enqueue(self, req: Request) -> None:
        """Into WAITING by (priority, arrival), as vLLM's PriorityRequestQueue pops them."""
        bisect.insort(self.waiting, req, key=lambda r: (r.priority, r.arrival, r.rid))

    def abort(self, req: Request) -> None:
        """A client went away: drop the request wherever it is and free its blocks (one not yet added is
        marked finished, so the driver skips it)."""
        req.max_output = req.num_output
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        else:
            return
        self._free(req, preempted=False)

    def refuse_unfittable(self) -> Request | None:
        """After a step that scheduled nothing: the waiting head if nothing runs and its whole sequence needs
        more KV blocks than the cache has, taken out (it could never run; the driver refuses it) so the
        requests behind it go on. None otherwise: a step that only preempted, or a head that waits for blocks
        running requests hold, is not stuck (it is admitted once they free them)."""
        if self.running or not self.waiting:
            return None
        req = self.waiting[0]
        if -(-req.num_tokens // self.block) <= self.pool.total:
            return None
        self.waiting.popleft()
        self._free(req, preempted=False)
        return req

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def usage(self) -> float:
        return self.pool.used / self.pool.total if self.pool.total else 0.0

    def _free(self, req: Request, preempted: bool) -> None:
        pool = self.pool
        pool.private -= req.blocks
        req.blocks = 0
        # Tail blocks first (vLLM frees a request's blocks in reverse order): eviction, oldest freed first,
        # then takes a prompt's tail before its head, so a shared prefix outlives the questions behind it.
        refs = pool.refs
        evictable = pool.evictable
        log = pool.log
        for h in reversed(req.shared):  # BlockPool.unref inlined (the hot loop of long prompts)
            n = refs[h] - 1
            if n > 0:
                refs[h] = n
            elif preempted:
                del refs[h]
                if log is not None:
                    log.append((False, h))
            else:
                refs[h] = 0
                evictable[h] = None
        req.shared = []
        req.cached_upto = 0

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
        self._free(victim, preempted=True)
        victim.num_computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        if self.policy == "priority":
            self._enqueue(victim)
        else:
            self.waiting.appendleft(victim)
        plan.preempted.append(victim)

    def _count(self, plan: StepPlan, req: Request, num_new: int, spec: int) -> None:
        ctx = req.num_computed
        plan.scheduled.append((req, num_new))
        req.spec_scheduled = spec
        plan.context_tokens += ctx
        if ctx < req.num_tokens - 1:  # prefill (or recompute) chunk
            plan.prefill_tokens += num_new
            plan.prefill_pairs += num_new * (ctx + num_new / 2)
        else:
            plan.decode_tokens += num_new
            plan.decode_pairs += num_new * (ctx + num_new / 2)

    def _uncount(self, plan: StepPlan, req: Request) -> int:
        """Take back a request scheduled earlier in this step (before it is preempted); its tokens."""
        at = next(k for k, (r, _) in enumerate(plan.scheduled) if r is req)
        _, num_new = plan.scheduled.pop(at)
        ctx = req.num_computed
        plan.context_tokens -= ctx
        if ctx < req.num_tokens - 1:
            plan.prefill_tokens -= num_new
            plan.prefill_pairs -= num_new * (ctx + num_new / 2)
        else:
            plan.decode_tokens -= num_new
            plan.decode_pairs -= num_new * (ctx + num_new / 2)
        req.spec_scheduled = 0
        return num_new

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.max_num_batched_tokens
        pool = self.pool
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            num_new = req.num_tokens - req.num_computed
            spec = 0
            if num_new == 1 and self.k:  # decoding: add drafts, never past the output's end or the budget
                spec = min(self.k, req.max_output - req.num_output - 1, budget - 1)
                spec = max(spec, 0)
                num_new += spec
            num_new = min(num_new, budget)
            need = -(-(req.num_computed + num_new) // self.block) - req.blocks - len(req.shared)
            scheduled = True
            while need > 0 and not pool.allocate(need):
                if self.policy == "priority":  # the lowest priority, the latest arrival among them
                    victim = max(running, key=lambda r: (r.priority, r.arrival))
                    at = running.index(victim)
                    running.pop(at)
                    if at < i:  # already scheduled in this step: its tokens go back to the budget
                        budget += self._uncount(plan, victim)
                        i -= 1
                else:
                    victim = running.pop()  # the newest running request
                self._preempt(victim, plan)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            if need > 0:
                req.blocks += need
            self._count(plan, req, num_new, spec)
            budget -= num_new
            i += 1
        if not plan.preempted:
            while self.waiting and budget > 0 and len(running) < self.max_num_seqs:
                req = self.waiting[0]
                hits = 0
                if req.num_computed == 0 and self.prefix_caching:
                    hits = self._lookup(req)
                    plan.prefix_queries += req.num_tokens
                    plan.prefix_hits += hits * self.block
                num_new = min(req.num_tokens - req.num_computed, budget)
                need = -(-(req.num_computed + num_new) // self.block) - req.blocks - len(req.shared)
                if self.full_sequence_admission and (
                        -(-req.num_tokens // self.block) - req.blocks - len(req.shared) > pool.free):
                    self._release_hits(req)
                    break
                if not pool.allocate(need):
                    self._release_hits(req)
                    break
                req.blocks += max(need, 0)
                self.waiting.popleft()
                running.append(req)
                plan.admitted.append(req)
                self._count(plan, req, num_new, 0)
                budget -= num_new
        return plan

    def _lookup(self, req: Request) -> int:
        """Reference the leading cached blocks of the prompt; returns how many (vLLM computes >= 1 token)."""
        refs = self.pool.refs
        evictable = self.pool.evictable
        limit = (req.num_tokens - 1) // self.block
        shared = req.shared
        for h in req.hashes[:limit]:  # BlockPool.ref inlined: a long prompt makes this the fleet's hot loop
            n = refs.get(h) if h is not None else None
            if n is None:
                break
            if n == 0:
                del evictable[h]
            refs[h] = n + 1
            shared.append(h)
        hits = len(shared)
        req.num_computed = hits * self.block
        req.cached_upto = hits
        return hits

    def _release_hits(self, req: Request) -> None:
        for h in req.shared:
            self.pool.unref(h)
        req.shared = []
        req.num_computed = 0
        req.cached_upto = 0

    def _promote(self, req: Request) -> None:
        """Full prompt blocks just computed enter the prefix cache (unless an identical block is there)."""
        pool = self.pool
        upto = min(req.num_computed // self.block, len(req.hashes))
        i = req.cached_upto
        while i < upto:
            h = req.hashes[i]
            if h is None or h in pool.refs or len(req.shared) != i:
                i = len(req.hashes)  # the rest stays private
                break
            pool.refs[h] = 1  # the block changes hands: private -> cached
            if pool.log is not None:
                pool.log.append((True, h))
            pool.private -= 1
            req.shared.append(h)
            req.blocks -= 1
            i += 1
        req.cached_upto = i

    def update(self, plan: StepPlan, accepted: dict[int, int] | None = None) -> tuple[list[tuple[Request, int]],
                                                                                      list[Request]]:
        """Apply the step's results: returns (request, tokens emitted) pairs and the finished requests.

        accepted: draft tokens accepted per request id (speculative decoding), from the engine's sampler."""
        emitted: list[tuple[Request, int]] = []
        finished: list[Request] = []
        caching = self.prefix_caching
        for req, num_new in plan.scheduled:
            req.num_computed += num_new
            if caching and req.cached_upto < len(req.hashes):
                self._promote(req)
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            n = 1
            spec = req.spec_scheduled
            if spec:
                a = accepted.get(req.rid, 0) if accepted else 0
                req.num_computed -= spec - a
                n += a
            n = min(n, req.max_output - req.num_output)
            req.num_output += n
            emitted.append((req, n))
            if req.num_output >= req.max_output:
                finished.append(req)
        if finished:
            done = set(map(id, finished))
            self.running = [r for r in self.running if id(r) not in done]
            for req in finished:
                self._free(req, preempted=False)
        return emitted, finished
