"""Hand-checked engine cases on a fitted step model whose arithmetic is exact: a step costs 1 ms plus 0.1 ms
per prefill token (decode tokens free), so TTFT follows from how many prompt tokens the prefix cache saved.
Partial prefix hits, LRU eviction under KV pressure (tail blocks first, as vLLM frees them), async
scheduling's one-step lag, the CPU backend's 128-token blocks and the queue time."""

import dataclasses

import numpy as np
import pytest

from oculis.engine import ModelConfig
from oculis_sim import config, replay, steptime
from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import Request
from oculis_sim.workload import Workload

TINY = ModelConfig(params_billions=0.003, num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                   head_dim=64, vocab_size=4096, max_position_embeddings=2048)
PROFILE = steptime.FittedSteps(step_s=1e-3, request_s=0.0, prefill_token_s=1e-4, decode_token_s=0.0)


def engine(blocks: int = 64, block_size: int = 16, budget: int = 512, length: int = 512) -> EngineCore:
    s = config.resolve("tiny", "CPU", model_config=TINY, max_num_seqs=8, max_num_batched_tokens=budget,
                       max_model_len=str(length), num_gpu_blocks_override=blocks, block_size=block_size,
                       step_profile=PROFILE)
    return EngineCore(s)


def first_token(core: EngineCore, req: Request, now: float) -> float:
    """Run steps from `now` until `req` has its first token; returns that step's end (its TTFT on this clock)."""
    core.add(req)
    t = now
    while True:
        res = core.step(t)
        t = res.end
        if any(r is req for r, _ in res.emitted):
            return t - now


def drain(core: EngineCore, t: float) -> float:
    while core.has_work():
        t = core.step(t).end
    return t


def test_a_partial_prefix_hit_saves_exactly_the_shared_blocks() -> None:
    core = engine()
    a = Request(0, 100, 2, 0.0, tuple(("a", i) for i in range(6)))  # 6 full blocks of 16
    assert first_token(core, a, 0.0) == pytest.approx(1e-3 + 100 * 1e-4)  # nothing cached: 11 ms
    drain(core, 0.1)
    b = Request(1, 100, 2, 1.0, (("a", 0), ("a", 1), ("b", 2), ("b", 3), ("b", 4), ("b", 5)))
    assert first_token(core, b, 1.0) == pytest.approx(1e-3 + (100 - 32) * 1e-4)  # 2 blocks hit: 7.8 ms
    assert core.counters.prefix_hits == 32 and core.counters.prefix_queries == 200


def test_eviction_under_kv_pressure_takes_the_tail_blocks_first() -> None:
    core = engine(blocks=8, length=96)  # 7 usable blocks of 16 tokens
    a = Request(0, 64, 1, 0.0, tuple(("a", i) for i in range(4)))
    first_token(core, a, 0.0)  # finished: its 4 blocks stay cached, evictable
    c = Request(1, 80, 1, 0.0, tuple(("c", i) for i in range(5)))
    first_token(core, c, 1.0)  # needs 5 blocks, 3 are free: evicts 2 of a's, its tail ones (a3, a2)
    b = Request(2, 64, 1, 0.0, tuple(("a", i) for i in range(4)))
    ttft = first_token(core, b, 2.0)
    assert ttft == pytest.approx(1e-3 + (64 - 32) * 1e-4)  # a0 and a1 survived: 32 tokens hit
    assert core.counters.preemptions == 0


def test_preemption_under_kv_pressure_recomputes_the_victim() -> None:
    core = engine(blocks=7, budget=256, length=96)  # 6 usable blocks
    first = Request(0, 40, 40, 0.0)  # grows to 80 tokens = 5 blocks
    second = Request(1, 40, 40, 0.0)
    core.add(first)
    core.add(second)
    drain(core, 0.0)
    assert core.counters.preemptions >= 1 and second.preemptions >= 1 and first.preemptions == 0
    assert first.num_output == 40 and second.num_output == 40  # both finish: recompute, not loss
    assert core.scheduler.pool.private == 0 and core.scheduler.pool.used == 0


def test_async_scheduling_schedules_a_mid_step_arrival_two_steps_later() -> None:
    core = engine()
    core.cost = dataclasses.replace(core.cost, overlap=True)  # vLLM >= 0.12
    busy = Request(0, 16, 50, 0.0)
    core.add(busy)
    t = core.step(0.0).end  # 1 ms + 1.6 ms prefill
    late = Request(1, 10, 5, t + 1e-4)  # arrives just after step 1 starts
    core.add(late)
    step1 = core.step(t)
    assert [r.rid for r, _ in step1.plan.scheduled] == [0]
    step2 = core.step(step1.end)  # planned when step 1 started, before `late` arrived: without it
    assert [r.rid for r, _ in step2.plan.scheduled] == [0]
    step3 = core.step(step2.end)  # planned when step 2 started, after `late` arrived
    assert {r.rid for r, _ in step3.plan.scheduled} == {0, 1}
    sync = engine()
    sync.add(Request(0, 16, 50, 0.0))
    t = sync.step(0.0).end
    sync.add(Request(1, 10, 5, t + 1e-4))
    sync_step1 = sync.step(t)
    assert {r.rid for r, _ in sync.step(sync_step1.end).plan.scheduled} == {0, 1}  # synchronous: step 2


def test_cpu_blocks_of_128_tokens_hit_only_whole_blocks() -> None:
    s = config.resolve("tiny", "CPU", model_config=TINY, max_num_seqs=8, max_num_batched_tokens=512,
                       max_model_len="512", num_gpu_blocks_override=32, block_size=128, step_profile=PROFILE)
    # 3 requests sharing a 300-token prefix (2 whole blocks of 128), 1 s apart so each finds the cache warm
    wl = Workload(np.array([0.0, 1.0, 2.0]), np.array([400, 400, 400]), np.array([4, 4, 4]), 300, None,
                  np.array([0, 0, 0]))
    res = replay.run(s, wl)
    assert res.prefix_hit_rate == pytest.approx(2 * 256 / 1200)
    ttfts = sorted([1e-3 + 400 * 1e-4, 1e-3 + 144 * 1e-4, 1e-3 + 144 * 1e-4])
    assert res.summary["ttft_ms"]["mean"] == pytest.approx(1000 * sum(ttfts) / 3, abs=1e-3)


def test_queue_time_is_the_wait_before_first_scheduled() -> None:
    s = config.resolve("tiny", "CPU", model_config=TINY, max_num_seqs=1, max_num_batched_tokens=512,
                       max_model_len="512", num_gpu_blocks_override=64, step_profile=PROFILE)
    # two at once, one sequence at a time: the second waits for the first's prefill (1 ms + 10 ms) and 4
    # decode steps (1 ms each)
    wl = Workload(np.array([0.0, 0.0]), np.array([100, 100]), np.array([5, 5]), 0, None)
    res = replay.run(s, wl)
    assert res.queue_ms["mean"] == pytest.approx((0 + 15.0) / 2, abs=1e-6)


def test_from_019_a_waiting_request_is_admitted_only_if_its_whole_sequence_fits() -> None:
    from oculis_sim.scheduler import Scheduler

    def first_step(full: bool) -> list[int]:
        s = Scheduler(num_blocks=6, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=96,
                      full_sequence_admission=full)  # 5 usable blocks of 16
        s.add(Request(0, 40, 8))  # 3 blocks
        s.add(Request(1, 40, 8))  # its first 24-token chunk needs 2 blocks, the whole prompt 3
        return [r.rid for r, _ in s.schedule().scheduled]

    assert first_step(full=False) == [0, 1]  # before 0.19: the first chunk fits, admitted
    assert first_step(full=True) == [0]  # 0.19+: 3 blocks needed, 2 free: waits


def test_the_version_decides_full_sequence_admission() -> None:
    old = config.resolve("tiny", "CPU", model_config=TINY, max_model_len="512", num_gpu_blocks_override=64,
                         step_profile=PROFILE, vllm_version="0.15")
    new = dataclasses.replace(old, vllm_version=(0, 19))
    assert not EngineCore(old).scheduler.full_sequence_admission
    assert EngineCore(new).scheduler.full_sequence_admission
