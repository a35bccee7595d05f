"""Prefix hits, eviction under KV pressure and multi-replica replay on hand-checked cases; prefix groups
in workload files; `oculis sim fleet`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oculis_sim import config, decoderun, fleet, workload
from oculis_sim.cli import main
from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import Request, Scheduler

L8 = "meta-llama/Llama-3.1-8B-Instruct"


def settings(**kw: object) -> config.Settings:
    return config.resolve(L8, "H100-80GB", **kw)  # type: ignore[arg-type]


def test_ttft_with_a_partial_prefix_hit_prices_only_the_uncached_tokens() -> None:
    core = EngineCore(settings())
    keys = tuple(range(1, 251))  # 250 full blocks = 4,000 tokens of a 4,010-token prompt
    core.add(Request(0, 4010, 1, hashes=keys))
    first = core.step(0.0)
    assert first.plan.prefill_tokens == 4010
    # a second prompt shares the first 200 blocks (3,200 tokens), then differs
    core.add(Request(1, 4010, 1, hashes=(*keys[:200], *range(900, 950))))
    second = core.step(first.end)
    plan = second.plan
    assert (plan.prefix_hits, plan.prefill_tokens, plan.context_tokens) == (3200, 810, 3200)
    cost = core.cost.step_seconds(810, 810 * (3200 + 810 / 2), 0, 0.0, 3200, 1)
    assert second.end - second.start == pytest.approx(cost)
    assert cost < (first.end - first.start) / 3  # compute-bound prefill: the hit saved most of it


def test_eviction_under_kv_pressure_takes_the_tail_first_so_a_shared_prefix_survives() -> None:
    s = Scheduler(num_blocks=7, max_num_seqs=8, max_num_batched_tokens=8192, max_model_len=4096)  # 6 usable
    s.pool.log = []
    a = Request(0, 64, 1, hashes=("p0", "p1", "q0", "q1"))  # a 2-block prefix, then its own question
    s.add(a)
    s.update(s.schedule())
    assert not s.has_work() and list(s.pool.evictable) == ["q1", "q0", "p1", "p0"]  # freed tail first
    assert s.pool.log == [(True, "p0"), (True, "p1"), (True, "q0"), (True, "q1")]
    s.pool.log.clear()
    s.add(Request(1, 64, 1))  # 4 blocks of unique content: 2 free + 2 evicted, the question's
    s.update(s.schedule())
    assert s.pool.log == [(False, "q1"), (False, "q0")]
    b = Request(2, 48, 1, hashes=("p0", "p1", "r0"))
    s.add(b)
    plan = s.schedule()
    assert plan.prefix_hits == 32  # the prefix outlived the question


def test_a_decode_run_equals_stepping_one_step_at_a_time() -> None:
    def fresh() -> EngineCore:
        core = EngineCore(settings(num_gpu_blocks_override=400, max_model_len="2048"))
        for i in range(5):
            core.add(Request(i, 100 + 30 * i, 60 + 7 * i))
        core.step(0.0)
        return core

    a, b = fresh(), fresh()
    k = decoderun.max_steps(a)
    assert k == 58  # the shortest request has 59 tokens left after its first; the last is left to EngineCore.step
    run = decoderun.DecodeRun(a, 1.0, k)
    t = 1.0
    for _ in range(20):
        t = b.step(t).end
    run.apply(20)
    assert run.ends[19] == pytest.approx(t)
    assert [(r.num_computed, r.num_output, r.blocks) for r in a.scheduler.running] == \
        [(r.num_computed, r.num_output, r.blocks) for r in b.scheduler.running]
    assert a.scheduler.pool.free == b.scheduler.pool.free
    assert (a.counters.steps, a.counters.generation_tokens) == (b.counters.steps, b.counters.generation_tokens)


def test_no_decode_run_while_a_request_waits_or_blocks_would_run_out() -> None:
    core = EngineCore(settings(num_gpu_blocks_override=40, max_num_seqs=1, max_model_len="600"))
    core.add(Request(0, 100, 50))
    core.add(Request(1, 100, 50))
    core.step(0.0)
    assert decoderun.max_steps(core) == 0  # request 1 waits for the single seat
    small = EngineCore(settings(num_gpu_blocks_override=9, max_model_len="128"))  # 8 usable blocks
    small.add(Request(0, 100, 27))  # 7 blocks for the prompt; token 113 needs an 8th, token 129 a 9th
    small.step(0.0)
    assert decoderun.max_steps(small) == 25  # 26 tokens left, the last for EngineCore.step; all fit in 8 blocks


GROUPS = {"prompt_tokens": 40, "output_tokens": 20, "prefix_groups": {"count": 2, "tokens": 320},
          "stages": [{"rate": 4, "seconds": 20}], "seed": 3}


def test_multi_replica_replay_keeps_each_group_on_its_replica_with_the_prefix_picker() -> None:
    # a 1,024-token prefix: its prefill (~34 ms) saves more than the two decode steps within which the picker
    # calls waits equal (a 320-token one, ~11 ms, is within them, and rotation spreads its group)
    s = settings()
    wl = workload.parse({**GROUPS, "prefix_groups": {"count": 2, "tokens": 1024}})
    sticky = fleet.run(s, wl, 2, "prefix").summary
    spread = fleet.run(s, wl, 2, "round-robin").summary
    assert sticky["requests"] == spread["requests"] == len(wl)
    # 2 groups of 64 prefix blocks: prefix pays each group's prefill once, round-robin once per replica
    groups = 2 * 64 * 16
    queried = sum(int(p) for p in wl.prompt_tokens)
    assert sticky["prefix_hit_share"] > spread["prefix_hit_share"]
    assert sticky["prefix_hit_share"] == pytest.approx((64 * 16 * len(wl) - groups) / queried, abs=0.02)
    counts = [r["requests"] for r in spread["per_replica"]]
    assert sum(counts) == len(wl) and max(counts) - min(counts) <= 1  # round-robin alternates
    assert sticky == fleet.run(s, wl, 2, "prefix", decode_runs=False).summary  # the fast path changes nothing


def test_kv_events_picker_sees_the_engines_evictions() -> None:
    s = settings(num_gpu_blocks_override=60, max_model_len="512")  # 59 usable blocks: 2 prefixes of 20
    wl = workload.parse({**GROUPS, "prefix_groups": {"count": 6, "tokens": 320},
                         "stages": [{"rate": 6, "seconds": 20}]})
    events = fleet.run(s, wl, 2, "kv-events").summary
    approx = fleet.run(s, wl, 2, "prefix").summary
    assert events["requests"] == approx["requests"] == len(wl)
    assert events["prefix_hit_share"] >= approx["prefix_hit_share"]


def test_prefix_groups_draw_groups_users_and_conversations() -> None:
    wl = workload.parse({**GROUPS, "prompt_tokens": {"mean": 50, "stdev": 20, "min": 10, "max": 90},
                         "prefix_groups": {"count": 3, "tokens": 100, "users_per_group": 2}})
    assert wl.prefix_groups is not None and wl.prompt_ids is not None
    assert set(wl.prefix_groups.tolist()) <= {0, 1, 2} and wl.shared_prefix_tokens == 100
    by_user: dict[tuple[int, int], set[int]] = {}
    for g, u, p in zip(wl.prefix_groups.tolist(), wl.prompt_ids.tolist(), wl.prompt_tokens.tolist(), strict=True):
        by_user.setdefault((g, u), set()).add(p)
    assert all(len(v) == 1 for v in by_user.values())  # a user's question is drawn once
    keys = wl.block_keys(16)
    same = [i for i in range(len(wl)) if wl.prefix_groups[i] == wl.prefix_groups[0]]
    assert len({keys(i)[:6] for i in same}) == 1  # 100 tokens: the group's 6 full prefix blocks
    multi = workload.parse({**GROUPS, "prefix_groups": {"count": 1, "tokens": 32, "users_per_group": 1,
                                                         "multi_turn": True}})
    assert multi.prompt_tokens.tolist()[:3] == [72, 132, 192]  # 32 + 40; + 40 answered with 20, + 40 again
    mk = multi.block_keys(16)
    assert mk(1)[:4] == mk(0)[:4] and mk(2)[:8] == mk(1)[:8]  # the conversation so far is a prefix


@pytest.mark.parametrize(("groups", "fix"), [
    ({"count": 0, "tokens": 10}, "prefix_groups.count: 0 must be an integer >= 1"),
    ({"count": 2}, "prefix_groups.tokens: None must be an integer >= 0"),
    ({"count": 2, "tokens": 8, "multi_turn": True}, "prefix_groups.multi_turn: needs users_per_group"),
    ({"count": 2, "tokens": 8, "users": 3}, "prefix_groups.users: unknown key"),
    ("many", "prefix_groups: 'many' must be a positive integer"),
])
def test_bad_prefix_groups_are_one_line_naming_the_field(groups: object, fix: str) -> None:
    with pytest.raises(workload.WorkloadError, match=fix):
        workload.parse({**GROUPS, "prefix_groups": groups})
    with pytest.raises(workload.WorkloadError, match="drop shared_prefix_tokens"):
        workload.parse({**GROUPS, "shared_prefix_tokens": 64})


def test_sim_fleet_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps(GROUPS))
    code = main(["fleet", "--model", L8, "--gpu", "H100-80GB", "--replicas", "2", "--picker", "kv-events",
                 "--workload", str(wl), "-o", "json"])
    out = capsys.readouterr()
    assert code == 0 and "simulated" in out.err
    data = json.loads(out.out)
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(data[key]) == {"mean", "p50", "p90", "p99"}
    assert {"output_tokens_per_s", "prefix_hit_share", "per_replica"} <= set(data)
    assert len(data["per_replica"]) == 2
    assert set(data["per_replica"][0]) >= {"requests", "prefix_hit_share", "peak_kv_usage"}
    assert main(["fleet", "--model", L8, "--gpu", "H100-80GB", "--picker", "closest", "--workload", str(wl)]) == 2
    assert "--picker 'closest': not a picker" in capsys.readouterr().err
