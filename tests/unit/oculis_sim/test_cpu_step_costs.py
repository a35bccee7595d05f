"""Hand-checked cases for the CPU step profile and the token recorder, and the profile fit recovering a known
profile from the engine figures it would produce (bench/cpu_profile.py).

The profile: a step costs 1 ms + 0.1 ms per prefill token; the step that admits requests costs 5 ms more,
once (`join_s`) or per admitted request (`new_request_s`): vLLM's CPU engine pays it once per lone request
however many chunks its prompt takes (measured: 8 chunks of 64 tokens cost 1 admission, not 8)."""

import dataclasses
import json
import sys
from array import array
from pathlib import Path

import pytest

from oculis.engine import ModelConfig
from oculis_sim import config, steptime
from oculis_sim.engine import EngineCore
from oculis_sim.scheduler import Request
from oculis_sim.tokenrecorder import Rec, TokenRecorder

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import cpu_engine
import cpu_profile

TINY = ModelConfig(params_billions=0.003, num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                   head_dim=64, vocab_size=4096, max_position_embeddings=2048)
ONCE = steptime.FittedSteps(step_s=1e-3, request_s=0.0, prefill_token_s=1e-4, decode_token_s=0.0, join_s=5e-3)
PER_REQUEST = dataclasses.replace(ONCE, join_s=0.0, new_request_s=5e-3)


def engine(profile: steptime.FittedSteps, budget: int = 512) -> EngineCore:
    s = config.resolve("tiny", "CPU", model_config=TINY, max_num_seqs=8, max_num_batched_tokens=budget,
                       max_model_len="512", num_gpu_blocks_override=64, block_size=128, step_profile=profile)
    return EngineCore(s)


def steps_until_first_tokens(core: EngineCore, reqs: list[Request]) -> list[float]:
    for r in reqs:
        core.add(r)
    t, firsts = 0.0, {}
    while len(firsts) < len(reqs):
        res = core.step(t)
        t = res.end
        for r, _ in res.emitted:
            firsts.setdefault(r.rid, t)
    return [firsts[r.rid] for r in reqs]


def test_a_chunked_prompt_pays_the_admission_once() -> None:
    # 200 tokens over a 64-token budget: chunks 64, 64, 64, 8; only the first step admits
    (ttft,) = steps_until_first_tokens(engine(ONCE, budget=64), [Request(0, 200, 4)])
    assert ttft * 1e3 == pytest.approx((1 + 5 + 6.4) + (1 + 6.4) * 2 + (1 + 0.8))  # 29.0 ms


def test_requests_admitted_together_pay_once_per_step_or_once_each() -> None:
    two = [Request(0, 16, 4), Request(1, 16, 4)]
    assert [t * 1e3 for t in steps_until_first_tokens(engine(ONCE), two)] == pytest.approx([9.2, 9.2])
    two = [Request(0, 16, 4), Request(1, 16, 4)]
    assert [t * 1e3 for t in steps_until_first_tokens(engine(PER_REQUEST), two)] == pytest.approx([14.2, 14.2])


def test_decode_steps_pay_no_admission() -> None:
    core = engine(ONCE)
    steps_until_first_tokens(core, [Request(0, 16, 4)])
    res = core.step(1.0)
    assert res.end - res.start == pytest.approx(1e-3)


def test_a_batch_change_is_paid_by_the_step_after_a_finish_not_by_join_only_profiles() -> None:
    # a (2 outputs) and b (4) join together; a finishes in the first decode step; the next step drops it
    durations = {}
    for name, prof in (("join", ONCE), ("change", dataclasses.replace(ONCE, join_s=0.0, batch_change_s=5e-3))):
        core = engine(prof)
        core.add(Request(0, 16, 2))
        core.add(Request(1, 16, 4))
        t, got = 0.0, []
        while core.has_work():
            res = core.step(t)
            got.append(round((res.end - res.start) * 1e3, 6))
            t = res.end
        durations[name] = got
    assert durations["join"] == [9.2, 1.0, 1.0, 1.0]  # prefill of 32 tokens + the join, then decodes
    assert durations["change"] == [9.2, 1.0, 6.0, 1.0]  # the step after a's last token drops it


def test_the_recorder_adds_streaming_lag_and_finish_and_weights_a_decode_runs_gaps() -> None:
    rec: TokenRecorder[Rec] = TokenRecorder(1, per_token_s=1e-3, finish_s=2e-3)
    rec.recs[0] = Rec(0.0)
    req = Request(0, 16, 4)
    req.num_output = 1
    assert rec.emitted(0.010, [(req, 1)]) == [rec.recs[0]]  # first token: visible 1 ms later
    req.num_output = 2
    assert rec.emitted(0.015, [(req, 1)]) == []
    assert list(rec.ttft) == pytest.approx([0.011]) and list(rec.itl) == pytest.approx([0.006])
    req.num_output = 4  # two decode steps of a batch of 2, 3 and 4 ms
    rec.decode_run(array("d", [0.003, 0.004]), 2, 0.022, [req])
    assert list(rec.itl) == pytest.approx([0.006, 0.004, 0.005]) and list(rec.itl_w) == [1.0, 2.0, 2.0]
    assert rec.out_tokens == 2 + 4
    rec.finished(req)
    assert list(rec.e2e) == pytest.approx([0.022 + 0.004 + 0.002])
    assert list(rec.tpot) == pytest.approx([(0.026 - 0.011) / 3])
    assert rec.last_done == pytest.approx(0.028)


def _recording(true: steptime.FittedSteps, engine_name: str = "roomy") -> dict[str, object]:
    """The engine histograms (one observation each) a known profile gives for the calibration runs."""
    budget = cpu_engine.ENGINES[engine_name]["max_num_batched_tokens"]
    runs: dict[str, list[dict[str, object]]] = {}

    def run(ttft: float, prefill: float, tpot: float, e2e: float, outputs: int) -> list[dict[str, object]]:
        e = {f"vllm:{h}_{x}": 0.0 for h in ("time_to_first_token_seconds", "inter_token_latency_seconds",
                                             "e2e_request_latency_seconds", "request_queue_time_seconds",
                                             "request_prefill_time_seconds", "request_decode_time_seconds")
             for x in ("sum", "count")}
        for h, v in (("time_to_first_token_seconds", ttft), ("request_prefill_time_seconds", prefill),
                     ("e2e_request_latency_seconds", e2e), ("request_queue_time_seconds", 0.0),
                     ("inter_token_latency_seconds", tpot)):
            e[f"vllm:{h}_sum"], e[f"vllm:{h}_count"] = v / 1000, 1.0
        e["vllm:request_decode_time_seconds_sum"] = tpot * (outputs - 1) / 1000
        e["vllm:request_decode_time_seconds_count"] = 1.0
        e.update({"vllm:generation_tokens_total": float(outputs), "vllm:num_preemptions_total": 0.0,
                  "vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0})
        return [{"engine": e}]

    for p in cpu_engine.PREFILL_LENGTHS:
        chunks = cpu_profile.chunks(p, budget)
        prefill = 1000 * (len(chunks) * (true.step_s + true.request_s) + true.join_s + true.prefill_token_s * p)
        ttft = prefill + 1000 * (true.api_s + true.api_serial_s)
        runs[f"prefill{p}"] = run(ttft, prefill, 1000 * (true.step_s + true.request_s), 0.0, 8)
    for b in cpu_engine.DECODE_BATCHES:
        sc = next(s for s in cpu_engine.calibration(engine_name) if s.name == f"decode{b}")
        sim = cpu_engine.simulate(sc, true)
        runs[f"decode{b}"] = run(sim["ttft_ms"], 0.0, 1000 * (true.step_s + true.request_s * b), sim["e2e_ms"], 64)
    return {"recorded": "synthetic", "runs": runs}


def test_the_fit_recovers_a_known_profile_from_its_calibration_figures() -> None:
    true = steptime.FittedSteps(step_s=3e-3, request_s=50e-6, prefill_token_s=20e-6, decode_token_s=0.0,
                                join_s=6e-3, api_s=5e-3, api_serial_s=1e-3)
    rec = json.loads(json.dumps(_recording(true)))
    got = cpu_profile.fit(rec, "roomy")
    assert got.step_s == pytest.approx(true.step_s, rel=1e-6)
    assert got.request_s == pytest.approx(true.request_s, rel=1e-6)
    assert got.prefill_token_s == pytest.approx(true.prefill_token_s, rel=1e-3)
    assert (got.join_s, got.new_request_s, got.batch_change_s) == pytest.approx((true.join_s, 0.0, 0.0), abs=1e-6)
    # a lone request pays both; how they split shows only where a burst outlasts the step it arrives in
    assert got.api_s + got.api_serial_s == pytest.approx(true.api_s + true.api_serial_s, abs=1e-9)
    for sc in cpu_engine.calibration("roomy"):
        if sc.name.startswith("decode"):
            want, have = cpu_engine.simulate(sc, true), cpu_engine.simulate(sc, got)
            assert (have["ttft_ms"], have["e2e_ms"]) == pytest.approx((want["ttft_ms"], want["e2e_ms"]), rel=1e-6)
