"""The discrete-event engine core: scheduler + step-time model + draft sampler on a caller's clock.

`step(now)` plans one engine step starting at `now`, applies its outcome and returns when it ends and
which requests got tokens. The replay driver advances a virtual clock to that end; the server sleeps
until it on the wall clock. Both therefore run the same engine.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from oculis_sim.config import Settings, cost_models
from oculis_sim.scheduler import Request, Scheduler, StepPlan
from oculis_sim.specdecode import AcceptanceSampler


@dataclass
class Counters:
    """Monotonic totals, as vLLM's Prometheus counters count them."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    steps: int = 0
    peak_kv_usage: float = 0.0


@dataclass
class StepResult:
    start: float
    end: float
    emitted: list[tuple[Request, int]]
    finished: list[Request]
    plan: StepPlan


# From this release a waiting request must fit whole before it is admitted (vllm#37307, merged 2026-03-24;
# default on, as ai-dynamo/dynamo#9721 mirrors it). The release is the first after the merge (an assumption).
FULL_SEQUENCE_ADMISSION = (0, 19)


class EngineCore:
    def __init__(self, settings: Settings) -> None:
        s = settings
        self.settings = s
        k = s.spec.num_speculative_tokens if s.spec else 0
        self.scheduler = Scheduler(s.num_blocks, s.max_num_seqs, s.max_num_batched_tokens, s.max_model_len, k,
                                   s.prefix_caching, s.block_size, s.vllm_version >= FULL_SEQUENCE_ADMISSION,
                                   "priority" if s.scheduling_policy == "priority" else "fcfs")
        self.cost, self.draft_cost = cost_models(s)
        self.k = k
        self.sampler = AcceptanceSampler(s.acceptance_rate, s.seed + 1) if k else None
        self.counters = Counters(spec_accepted_per_pos=[0] * k)
        # One pass of an EAGLE/MTP head: roughly one target layer plus the LM head, and a launch.
        m = s.model
        c = self.cost
        layer = c.weight_time_s * (1 / m.num_layers + 0.07)
        self.head_pass_s = layer + c.graph_s / m.num_layers + c.step_cpu_s / 2
        self.next_rid = 0
        # Async scheduling (vLLM >= 0.12): step N+1 is planned while step N runs, so a request that arrives
        # during step N is first scheduled in step N+2; its first token comes about a step later than with
        # synchronous scheduling (the inter-token gaps are unchanged).
        self.inbox: deque[tuple[float, Request]] = deque()
        # requests that finished in the last step: the model runner drops them from its batch in the next one
        self.left = 0
        self.prev_start = self.prev_end = -math.inf

    def add(self, req: Request, at: float | None = None) -> None:
        """`at`: when the engine core receives it (default: the request's arrival), in arrival order."""
        if self.cost.overlap:
            self.inbox.append((req.arrival if at is None else at, req))
        else:
            self.scheduler.add(req)

    def has_work(self) -> bool:
        return bool(self.inbox) or self.scheduler.has_work()

    def _admit_arrived(self, now: float) -> None:
        busy = self.prev_end >= now - 1e-12 and self.scheduler.has_work()
        cutoff = self.prev_start if busy else now  # an idle engine plans the next step at once
        inbox = self.inbox
        while inbox and inbox[0][0] <= cutoff:
            self.scheduler.add(inbox.popleft()[1])

    def _draft_seconds(self, plan: StepPlan, proposing: int, proposed_tokens: int) -> float:
        s = self.settings
        if not proposing or s.spec is None or s.spec.method == "ngram":
            return 0.0  # n-gram lookup runs on the CPU between steps
        if self.draft_cost is not None:  # k decode passes of the draft model over the proposing requests
            per = self.draft_cost.step_seconds(0, 0.0, proposing, float(plan.context_tokens), plan.context_tokens,
                                               proposing)
            return self.k * per
        return self.k * (self.head_pass_s + self.cost.request_cpu_s * proposing)

    def step(self, now: float) -> StepResult:
        sched = self.scheduler
        if self.inbox:
            if not sched.has_work():
                # Idle: the step starts when the next request reaches the core, not before. A driver that
                # steps back-to-back at the last step's end (sim serve, within 50 ms of it) would otherwise
                # plan an empty step: nothing had arrived by then (the "no progress" crash of sim serve).
                now = max(now, self.inbox[0][0])
            self._admit_arrived(now)
        plan = sched.schedule()
        c = self.counters
        c.steps += 1
        accepted: dict[int, int] | None = None
        proposing = 0
        drafts = 0
        if self.sampler is not None:
            spec_reqs = [r for r, _ in plan.scheduled if r.spec_scheduled]
            if spec_reqs:
                proposing = len(spec_reqs)
                ks = [r.spec_scheduled for r in spec_reqs]
                drafts = sum(ks)
                got = self.sampler.draw(ks)
                accepted = {r.rid: a for r, a in zip(spec_reqs, got, strict=True)}
                c.spec_drafts += proposing
                c.spec_draft_tokens += drafts
                c.spec_accepted += sum(got)
                per_pos = c.spec_accepted_per_pos
                for a in got:
                    for i in range(a):
                        per_pos[i] += 1
        duration = self.cost.step_seconds(plan.prefill_tokens, plan.prefill_pairs, plan.decode_tokens,
                                          plan.decode_pairs, plan.context_tokens, len(plan.scheduled),
                                          len(plan.admitted), bool(plan.admitted or plan.preempted or self.left))
        duration += self._draft_seconds(plan, proposing, drafts)
        for req in plan.admitted:
            if not req.started:
                req.started = True
                c.prompt_tokens += req.prompt_len
        c.prefix_queries += plan.prefix_queries
        c.prefix_hits += plan.prefix_hits
        c.preemptions += len(plan.preempted)
        usage = sched.usage()
        if usage > c.peak_kv_usage:
            c.peak_kv_usage = usage
        emitted, finished = sched.update(plan, accepted)
        self.left = len(finished)
        self.prev_start, self.prev_end = now, now + duration
        for _, n in emitted:
            c.generation_tokens += n
        return StepResult(now, now + duration, emitted, finished, plan)
