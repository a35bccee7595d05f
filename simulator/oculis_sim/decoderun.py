"""Many pure-decode steps of one engine at once: what makes a fleet hour replay in seconds.

While nothing waits and every running request is decoding (no speculative decoding), each step gives
every running request one token and the batch's context grows by its size, so step k's duration is the
step-time model at context C0 + k x B: no per-request work is needed to know when the steps end. A
`DecodeRun` lays out those ends (up to the first request's last token, within the free KV blocks, so no
preemption can happen) and applies the first j steps to the scheduler in one pass when the driver needs
the state: at the run's end, or when a request arrives or a scrape reads the gauges mid-run. The result
equals stepping one at a time (tests/unit/oculis_sim/test_fleet.py checks it).
"""

from __future__ import annotations

from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import Request

MAX_STEPS = 4096


def _new_blocks(reqs: list[Request], k: int, block: int) -> int:
    return sum(-(-(r.num_computed + k) // block) - r.blocks - len(r.shared) for r in reqs)


def max_steps(core: EngineCore) -> int:
    """How many pure-decode steps may run from the current state without a finish, an admission or a
    preemption (0 when the state is not pure decode); the step giving some request its last token is left
    to `EngineCore.step`, which frees it."""
    sched = core.scheduler
    if core.k or core.inbox or sched.waiting or not sched.running or (core.left and core.cost.batch_change_cpu_s):
        return 0  # (the step after a finish drops it from the batch: EngineCore.step prices that)
    block = sched.block
    running = sched.running
    if len(running) > sched.max_num_batched_tokens:
        return 0
    left = MAX_STEPS
    for r in running:
        if r.num_computed != r.num_tokens - 1 or r.cached_upto < len(r.hashes):
            return 0
        rest = r.max_output - r.num_output - 1
        if rest < left:
            left = rest
    if left < 2:
        return 0
    free = sched.pool.free
    if _new_blocks(running, left, block) > free:
        lo, hi = 0, left  # the most steps whose new blocks fit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _new_blocks(running, mid, block) <= free:
                lo = mid
            else:
                hi = mid - 1
        left = lo
    return left if left >= 2 else 0


class DecodeRun:
    """Steps 0..K-1 from `start`; `ends[k]` is when step k ends."""

    def __init__(self, core: EngineCore, start: float, steps: int, until: float = float("inf")) -> None:
        """until: lay out no steps past the first one ending after it (the driver will stop the run there
        anyway, e.g. at the next scrape)."""
        self.core = core
        self.start = start
        self.reqs = list(core.scheduler.running)
        b = len(self.reqs)
        self.batch = b
        ctx = sum(r.num_computed for r in self.reqs)
        cost = core.cost.step_seconds
        self.durations: list[float] = []
        self.ends: list[float] = []
        t = start
        for k in range(steps):
            c = ctx + k * b
            d = cost(0, 0.0, b, c + b / 2, c, b)  # as EngineCore.step prices a decode-only plan
            t += d
            self.durations.append(d)
            self.ends.append(t)
            if t > until:
                break
        self.applied = 0

    @property
    def steps(self) -> int:
        return len(self.ends)

    def in_progress(self, t: float) -> int:
        """Index of the step running at time t (the last one if t is at or past the run's end)."""
        lo, hi = 0, len(self.ends) - 1
        while lo < hi:  # first step whose end is after t
            mid = (lo + hi) // 2
            if self.ends[mid] > t:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def apply(self, j: int) -> None:
        """Apply steps 0..j-1 to the scheduler and the counters (once per run)."""
        assert self.applied == 0 and 0 < j <= len(self.ends)
        core = self.core
        sched = core.scheduler
        pool = sched.pool
        block = sched.block
        need = _new_blocks(self.reqs, j, block)
        ok = pool.allocate(need)
        assert ok, "max_steps checked the free blocks"
        for r in self.reqs:
            r.blocks += -(-(r.num_computed + j) // block) - r.blocks - len(r.shared)
            r.num_computed += j
            r.num_output += j
        c = self.core.counters
        c.steps += j
        c.generation_tokens += j * self.batch
        usage = sched.usage()
        if usage > c.peak_kv_usage:
            c.peak_kv_usage = usage
        core.prev_start = self.ends[j - 2] if j > 1 else self.start  # the last step, as EngineCore.step leaves them
        core.prev_end = self.ends[j - 1]
        self.applied = j
