"""Real vLLM V1 runs on H100s with exact request shapes (bench/data/vllm_h100_runs.json) through the simulator.

The runs (inference-perf, streaming completions, ignore_eos, prefix caching and chunked prefill on):
- 16 from inference-sim/training `default_args/` (Feb 2026: Llama-2-7B TP1, Llama-2-70B TP4, Mixtral-8x7B
  TP2, CodeLlama-34B TP2; four workloads each). The 12 that were not overloaded are IN-SAMPLE: the
  async-scheduling era's constants in `oculis_sim.versions` were fitted on them (`--fit`);
- 12 more from BLIS's trainval set (shapes: inference-sim/inference-sim testdata/trained_physics_iter29.json;
  measured means: inference-sim/sim-to-real-accuracy-validation results_trainval/error_records.csv):
  Llama-4-Scout FP8 TP2, Llama-3.1-70B TP4, Mistral-Nemo TP1/TP2, Qwen2.5-7B, Yi-34B TP2, Llama-2-7B with
  1,448-token outputs. OUT-OF-SAMPLE: never used to fit anything here.
Workload as inference-perf's shared_prefix generator builds it: groups x users fixed prompts (a system
prompt shared by the group + the user's question), each request one of them (repeats hit the prefix
cache whole), Poisson arrivals per stage. ITL is compared as (E2E - TTFT) / (output tokens - 1): the
sources count output tokens by re-tokenising the text, which undercounts Llama-2's (their ITL for those
runs is inflated by ~25 %), while ignore_eos makes the engine generate exactly output_len tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from oculis.engine import ModelConfig
from oculis_operator import catalog
from oculis_sim import config, replay, versions, workload

DATA = Path(__file__).parent / "data" / "vllm_h100_runs.json"
VERSION = (0, 15)  # the runs' era (Feb 2026; not recorded by the sources): V1 with async scheduling
OVERLOADED_TTFT_MS = 5000  # runs whose queue grew without bound (the sources exclude them as overload)


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


def in_sample(run: dict[str, Any]) -> bool:
    return run["id"].startswith("2026")  # inference-sim/training default_args


def usable(run: dict[str, Any]) -> bool:
    m = run["measured_ms"]
    return bool(m) and run["completed"] >= 0.99 * run["sent"] and m["ttft"] < OVERLOADED_TTFT_MS


def measured(run: dict[str, Any]) -> dict[str, float]:
    m = run["measured_ms"]
    return {"ttft": m["ttft"], "itl": (m["e2e"] - m["ttft"]) / (run["shape"]["output_len"] - 1), "e2e": m["e2e"]}


def settings(run: dict[str, Any], configs: dict[str, Any]) -> config.Settings:
    known = run["model"] in catalog.CATALOG
    mc = None if known else ModelConfig.model_validate(configs[run["model"]])
    return config.resolve(run["model"], "H100-80GB", model_config=mc, tp=run["tp"], max_num_seqs=run["max_num_seqs"],
                          max_num_batched_tokens=run["max_num_batched_tokens"],
                          max_model_len=str(run["max_model_len"] or 4096), gpu_memory_utilization=0.9,
                          num_gpu_blocks_override=run["kv_blocks"], vllm_version=VERSION)


def stage_seconds(rate: float, seconds: float, full: bool) -> float:
    """Enough of each stage for steady-state means (>= 600 requests or 60 s) unless `full`."""
    return seconds if full else min(seconds, max(60.0, 600.0 / rate))


def simulate(run: dict[str, Any], configs: dict[str, Any], full: bool = False) -> dict[str, float]:
    sh = run["shape"]
    wl = workload.parse({"prompt_tokens": sh["question_len"], "output_tokens": sh["output_len"],
                         "shared_prefix_tokens": sh["system_prompt_len"], "prefix_groups": sh["groups"],
                         "prompts_per_group": sh["users_per_group"], "seed": 7,
                         "stages": [{"rate": s["rate"], "seconds": stage_seconds(s["rate"], s["seconds"], full)}
                                    for s in run["stages"]]})
    sm = replay.run(settings(run, configs), wl).summary
    return {"ttft": sm["ttft_ms"]["mean"], "itl": sm["itl_ms"]["mean"], "e2e": sm["e2e_ms"]["mean"],
            "preemptions": sm["preemptions"]}


def errors(runs: list[dict[str, Any]], configs: dict[str, Any], full: bool = False) -> list[dict[str, Any]]:
    out = []
    for r in runs:
        sim, real = simulate(r, configs, full), measured(r)
        out.append({"run": r, "sim": sim, "real": real, "err": {k: sim[k] / real[k] - 1 for k in real}})
    return out


# ---- calibration (in-sample runs only) ----

FITTED = ("weight_bw", "kv_bw", "layer_launch_s", "allreduce_s", "api_s", "per_token_s")
UNITS = (1.0, 1.0, 1e-6, 1e-6, 1e-3, 1e-6)


def fit(max_evaluations: int = 80) -> versions.VersionProfile:
    """Nelder-Mead over the async era's free constants, minimising BLIS's loss (RMS of per-run relative
    error of mean TTFT, plus ITL, plus E2E) on the in-sample runs. Prints the constants; does not write them."""
    from scipy.optimize import minimize

    data = load()
    runs = [r for r in data["runs"] if usable(r) and in_sample(r)]
    base = versions.V1_ASYNC

    def profile(x: np.ndarray) -> versions.VersionProfile:
        kw = {n: float(v) * u for n, v, u in zip(FITTED, x, UNITS, strict=True)}
        return dataclasses.replace(base, graph_layer_s=kw["layer_launch_s"], **kw)

    def loss(x: np.ndarray) -> float:
        if not (0.05 < x[0] <= 1 and 0.05 < x[1] <= 1) or min(x[2:]) < 0:
            return 1e3
        saved = versions.ERAS
        versions.ERAS = (((0, 12), profile(x)), *saved[1:])
        try:
            res = errors(runs, data["model_configs"])
        finally:
            versions.ERAS = saved
        return sum(math.sqrt(statistics.fmean(min(e["err"][k] ** 2, 9) for e in res)) for k in ("ttft", "itl", "e2e"))

    x0 = np.array([getattr(base, n) / u for n, u in zip(FITTED, UNITS, strict=True)])
    best = minimize(loss, x0, method="Nelder-Mead", options={"maxfev": max_evaluations, "xatol": 1e-3})
    return profile(best.x)
