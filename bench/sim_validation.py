"""The engine simulator against real vLLM: per point the measured value and its source, the simulated
value and the error, in-sample points (used to fit a constant) marked; then the median |error| per metric.

Two families:
1. GPUs (published): real vLLM V1 runs on H100s with exact request shapes (bench/gpu_runs.py,
   bench/data/vllm_h100_runs.json; the async-scheduling era's constants were fitted on the in-sample
   ones), then older published points (../shared/notes/simulator.md section 7, B2-B9), each simulated
   with its own era's `--vllm-version`;
2. the real engine on this machine's CPU (bench/cpu_engine.py): the scheduler (order, budgets, chunking,
   preemption, prefix reuse) against vLLM's own, with each engine session's step-time profile fitted on
   its calibration runs only (bench/cpu_profile.py); recorded figures in bench/data/vllm_cpu_runs.json.

    .venv/bin/python bench/sim_validation.py              # both families from the recorded data
    .venv/bin/python bench/sim_validation.py --record-cpu # re-record the CPU engine live (~12 min, takes
                                                          # /tmp/oculis-vllm.lock, 3 engine starts), refit
    .venv/bin/python bench/sim_validation.py --fit-gpu    # refit the async era's constants (prints them)
All simulated figures are simulated, not measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from typing import Any

import cpu_engine
import cpu_profile
import gpu_runs

from oculis.engine import ModelConfig
from oculis_sim import config, replay, workload

L8 = "meta-llama/Llama-3.1-8B-Instruct"
L70 = "meta-llama/Llama-3.1-70B-Instruct"
# ShareGPT as vLLM's benchmark samples it: vllm#18566 reports 229,711 input / 203,068 output tokens over
# 1000 requests (means 230 / 203); long-tailed, so lognormal with stdev ~ mean (assumption).
SHAREGPT = {"prompt_tokens": {"distribution": "lognormal", "mean": 230, "stdev": 250, "min": 4, "max": 1024},
            "output_tokens": {"distribution": "lognormal", "mean": 203, "stdev": 220, "min": 4, "max": 1024}}
# mistralai/Mistral-7B-Instruct-v0.3 config.json (HF); 7.25 B parameters (model card).
MISTRAL_7B = ModelConfig(params_billions=7.25, num_layers=32, hidden_size=4096, num_attention_heads=32,
                         num_kv_heads=8, head_dim=128, vocab_size=32768, max_position_embeddings=32768)


@dataclass
class Point:
    key: str
    what: str
    source: str
    metric: str  # ITL, E2E or TTFT (what the error counts toward); tok/s is shown, not scored
    published: float
    settings: dict[str, Any]
    load: dict[str, Any]
    pick: str  # which simulated figure: itl_mean, itl_p50, tpot_mean, e2e_mean, ttft_mean
    assumption: str = ""
    version: str = "0.8"  # the vLLM release measured (simulated with that era's --vllm-version)
    fitted: bool = False  # in-sample: a constant of its era was chosen with this point in view


def shape(n: int, **extra: Any) -> dict[str, Any]:
    return {**SHAREGPT, "stages": [{"rate": "inf", "requests": n}], "seed": 11, **extra}


POINTS = [
    Point("B2", "Llama-3.1-8B H100, max_num_seqs 1, MT-Bench 80", "vllm#16937 (133 tok/s, V1)", "ITL", 1000 / 133,
          {"model_name": L8, "gpu_name": "H100-80GB", "max_num_seqs": 1},
          {"prompt_tokens": 100, "output_tokens": 256, "stages": [{"rate": "inf", "requests": 80}],
           "max_concurrency": 1}, "tokps_inv",
          "MT-Bench prompt ~100 tokens with template, 256 output (eagle.py's max_tokens); 133 tok/s incl. TTFT"),
    Point("B2e", "same, mean E2E = 256 tokens / 133 tok/s", "vllm#16937 (derived)", "E2E", 256 / 133 * 1000,
          {"model_name": L8, "gpu_name": "H100-80GB", "max_num_seqs": 1},
          {"prompt_tokens": 100, "output_tokens": 256, "stages": [{"rate": "inf", "requests": 80}],
           "max_concurrency": 1}, "e2e_mean", "at concurrency 1, E2E = output tokens / throughput"),
    Point("B3", "Llama-3.1-8B H100, 5000 ShareGPT at once, max_num_seqs 256, len 2048", "LambdaLabsML/vllm-benchmark "
          "benchmark_v0.md (v0.6.0 multi-step 10: TPOT 25.6 ms)", "ITL", 25.6,
          {"model_name": L8, "gpu_name": "H100-80GB", "max_num_seqs": 256, "max_num_batched_tokens": 2048,
           "max_model_len": "2048"}, shape(5000), "tpot_median",
          "V0 multi-step; TPOT median", version="0.6", fitted=True),
    Point("B4", "Llama-3.1-70B TP4 H100, same", "LambdaLabsML/vllm-benchmark (steps=10: TPOT 61 ms)", "ITL", 61.0,
          {"model_name": L70, "gpu_name": "H100-80GB", "tp": 4, "max_num_seqs": 256, "max_num_batched_tokens": 2048,
           "max_model_len": "2048"}, shape(5000), "tpot_median", "V0 multi-step; TPOT median",
          version="0.6", fitted=True),
    Point("B6h", "Llama-3.1-8B-FP8 1xH100, 320 ShareGPT at once", "LambdaLabsML/vllm-benchmark (v0.5.4: ITL 19.8 ms)",
          "ITL", 19.8, {"model_name": L8, "gpu_name": "H100-80GB", "quantization": "fp8", "max_num_seqs": 256,
                        "max_num_batched_tokens": 2048}, shape(320), "itl_mean",
          "statistic not stated: mean assumed", version="0.5", fitted=True),
    Point("B6a", "Llama-3.1-8B-FP8 1xA100-80GB, same", "LambdaLabsML/vllm-benchmark (v0.5.4: ITL 42.9 ms)", "ITL",
          42.9, {"model_name": L8, "gpu_name": "A100-80GB", "quantization": "fp8", "max_num_seqs": 256,
                 "max_num_batched_tokens": 2048}, shape(320), "itl_mean",
          "FP8 weights, BF16 compute on A100", version="0.5"),
    Point("B7", "Llama-3.1-70B-FP8 TP4 H100, same", "LambdaLabsML/vllm-benchmark (v0.5.4: ITL 38.3 ms)", "ITL", 38.3,
          {"model_name": L70, "gpu_name": "H100-80GB", "tp": 4, "quantization": "fp8", "max_num_seqs": 256,
           "max_num_batched_tokens": 2048}, shape(320), "itl_mean",
          "statistic not stated: mean assumed", version="0.5"),
    Point("B7b", "Llama-3.1-70B-FP8 TP2 H100, same", "LambdaLabsML/vllm-benchmark (v0.5.4: ITL 49.3 ms)", "ITL", 49.3,
          {"model_name": L70, "gpu_name": "H100-80GB", "tp": 2, "quantization": "fp8", "max_num_seqs": 256,
           "max_num_batched_tokens": 2048}, shape(320), "itl_mean",
          "statistic not stated: mean assumed", version="0.5"),
    Point("B8h", "Mistral-7B-Instruct-v0.3 1xH100, same", "LambdaLabsML/vllm-benchmark (v0.5.4: ITL 27.2 ms)", "ITL",
          27.2, {"model_name": "mistralai/Mistral-7B-Instruct-v0.3", "model_config": MISTRAL_7B,
                 "gpu_name": "H100-80GB", "max_num_seqs": 256, "max_num_batched_tokens": 2048}, shape(320),
          "itl_mean",
          "statistic not stated: mean assumed", version="0.5"),
    Point("B8a", "Mistral-7B-Instruct-v0.3 1xA100-80GB, same", "LambdaLabsML/vllm-benchmark (v0.5.4: ITL 56.5 ms)",
          "ITL", 56.5, {"model_name": "mistralai/Mistral-7B-Instruct-v0.3", "model_config": MISTRAL_7B,
                        "gpu_name": "A100-80GB", "max_num_seqs": 256, "max_num_batched_tokens": 2048}, shape(320),
          "itl_mean",
          "statistic not stated: mean assumed", version="0.5"),
    Point("B9i", "Llama-3.1-8B, vllm bench serve, 1000 ShareGPT at once, default server", "vllm#18566 (mean ITL "
          "38.13 ms)", "ITL", 38.13, {"model_name": L8, "gpu_name": "H100-80GB"}, shape(1000), "itl_mean",
          "GPU not stated (H100 assumed); vLLM defaults 1024 seqs / 8192 tokens", version="0.9"),
    Point("B9t", "same, mean TTFT", "vllm#18566 (mean TTFT 9626 ms)", "TTFT", 9626.13,
          {"model_name": L8, "gpu_name": "H100-80GB"}, shape(1000), "ttft_mean",
          "GPU not stated (H100 assumed); not modelled: the API server admitting 1000 chat requests one by one "
          "(TTFT p99/mean is only 1.3 there; BLIS reports 93 % MAPE for its constant API delay)", version="0.9"),
]


def simulate(p: Point) -> tuple[float, dict[str, Any]]:
    s = config.resolve(**p.settings, vllm_version=p.version)
    res = replay.run(s, workload.parse(p.load))
    sm = res.summary
    figures = {"itl_mean": sm["itl_ms"]["mean"], "itl_p50": sm["itl_ms"]["p50"], "e2e_mean": sm["e2e_ms"]["mean"],
               "ttft_mean": sm["ttft_ms"]["mean"], "tpot_median": res.tpot_ms["p50"],
               "tokps_inv": 1000 / sm["output_tokens_per_s"] if sm["output_tokens_per_s"] else 0.0}
    return figures[p.pick], sm


# Speculative decoding at batch 1 (vllm#16937: Llama-3.1-8B, H100, MT-Bench, V1): speed-up of output tok/s over
# no speculation, with the simulator's default per-position acceptance for the method.
SPEC_POINTS = [("EAGLE-1 k=2", '{"method": "eagle", "num_speculative_tokens": 2, '
                                '"model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B"}', 1.51),
               ("EAGLE-3 k=2", '{"method": "eagle3", "num_speculative_tokens": 2, '
                                '"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}', 1.65)]


def spec_speedups() -> None:
    load = {"prompt_tokens": 100, "output_tokens": 256, "stages": [{"rate": "inf", "requests": 80}],
            "max_concurrency": 1}
    base = replay.run(config.resolve(L8, "H100-80GB", max_num_seqs=1, vllm_version="0.8"), workload.parse(load))
    print("\nspeculative decoding, batch 1 (vllm#16937; shown, not in the medians):")
    for name, sc, published in SPEC_POINTS:
        s = config.resolve(L8, "H100-80GB", max_num_seqs=1, speculative_config=sc, vllm_version="0.8")
        res = replay.run(s, workload.parse(load))
        up = res.summary["output_tokens_per_s"] / base.summary["output_tokens_per_s"]
        print(f"  {name}: published {published:.2f}x, simulated {up:.2f}x ({(up - published) / published:+.1%}) at "
              f"acceptance {s.acceptance_rate:g} per position, mean acceptance length "
              f"{res.spec_acceptance_length or 0:.2f}")


def medians(title: str, table: dict[str, list[float]]) -> None:
    print(f"  median |error|, {title}: " + ", ".join(
        f"{m} {statistics.median(v):.1%} ({len(v)})" if v else f"{m} -" for m, v in table.items()))


def h100_runs(full: bool) -> None:
    data = gpu_runs.load()
    runs = [r for r in data["runs"] if gpu_runs.usable(r)]
    print("1a. Real vLLM V1 runs on H100 (exact shapes; simulated with --vllm-version "
          f"{gpu_runs.VERSION[0]}.{gpu_runs.VERSION[1]}), mean ms: measured / simulated (error)")
    ins: dict[str, list[float]] = {"TTFT": [], "ITL": [], "E2E": []}
    outs: dict[str, list[float]] = {"TTFT": [], "ITL": [], "E2E": []}
    for e in gpu_runs.errors(runs, data["model_configs"], full):
        r, real, sim, err = e["run"], e["real"], e["sim"], e["err"]
        table = ins if gpu_runs.in_sample(r) else outs
        cells = []
        for k, m in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E")):
            table[m].append(abs(err[k]))
            cells.append(f"{m} {real[k]:8.1f} / {sim[k]:8.1f} ({err[k]:+6.1%})")
        tag = "in " if gpu_runs.in_sample(r) else "OUT"
        print(f"  [{tag}] {r['id'][:44]:44} TP{r['tp']}  " + "  ".join(cells))
    skipped = [r["id"] for r in data["runs"] if not gpu_runs.usable(r)]
    print(f"  not compared (overloaded: queue grew without bound, as their sources say): {', '.join(skipped)}")
    medians("in-sample (fitted)", ins)
    medians("OUT-OF-SAMPLE", outs)
    medians("all", {k: ins[k] + outs[k] for k in ins})


def published_points() -> None:
    print("\n1b. Older published points, each simulated with its era (--vllm-version)")
    print(f"  {'point':6} {'metric':5} {'vLLM':>5} {'published':>10} {'simulated':>10} {'error':>8}  setup")
    ins: dict[str, list[float]] = {"TTFT": [], "ITL": [], "E2E": []}
    outs: dict[str, list[float]] = {"TTFT": [], "ITL": [], "E2E": []}
    for p in POINTS:
        value, sm = simulate(p)
        err = (value - p.published) / p.published
        (ins if p.fitted else outs)[p.metric].append(abs(err))
        tag = "in " if p.fitted else "OUT"
        print(f"  [{tag}] {p.key:6} {p.metric:5} {p.version:>5} {p.published:10.1f} {value:10.1f} {err:+8.1%}  "
              f"{p.what}")
        print(f"  {'':35}source: {p.source}; assumed: {p.assumption}; simulated {sm['output_tokens_per_s']:.0f} "
              f"tok/s, preemptions {sm['preemptions']}")
    medians("in-sample", ins)
    medians("OUT-OF-SAMPLE", outs)
    spec_speedups()


def cpu_engine_runs(record: bool) -> None:
    print("\n2. The real engine on this machine's CPU (vllm-cpu 0.32, tiny model) vs the simulator with a CPU step "
          "profile fitted on the same engine session's calibration runs")
    if record:
        cpu_engine.record(4, save=cpu_engine.DATA)
        cpu_profile.save(cpu_profile.fit(json.loads(cpu_engine.DATA.read_text()), "roomy"), cpu_engine.PROFILE)
    if not cpu_engine.DATA.exists():
        print("  no recording yet: run with --record-cpu (needs /work/vllm-venv and /work/tiny-model)")
        return
    rec = json.loads(cpu_engine.DATA.read_text())
    load = ", ".join(f"{x:.2f}" for x in rec.get("load_average_before", rec["load_average"]))
    print(f"  recorded {rec['recorded']} (load average before {load}); medians over repeats of vLLM's own histograms "
          "(its front end's clock)")
    profiles = {e: cpu_profile.fit(rec, e) for e in rec["engine_kv_blocks"]}
    for e, p in profiles.items():
        extra = (f"{p.new_request_s * 1e3:.2f} ms/new request" if p.new_request_s else
                 f"{p.join_s * 1e3:.2f} ms/step some request joins" if p.join_s else
                 f"{p.batch_change_s * 1e3:.2f} ms/step the batch changes")
        print(f"  profile of engine {e!r} (fitted on its calibration runs only): step {p.step_s * 1e3:.2f} ms + "
              f"{p.request_s * 1e3:.3f} ms/request + {extra} + "
              f"{p.prefill_token_s * 1e6:.1f} us/prefill token + {p.pair_s * 1e9:.2f} ns/attention pair; API "
              f"{p.api_s * 1e3:.2f} ms + {p.api_serial_s * 1e3:.2f} ms serial/request")
    table: dict[str, list[float]] = {"TTFT": [], "ITL": [], "E2E": [], "queue": []}
    client: dict[str, list[float]] = {"TTFT": [], "ITL": [], "E2E": []}
    verdicts = []
    for sc in cpu_engine.scenarios():
        if sc.name not in rec["runs"]:
            continue
        runs = rec["runs"][sc.name]
        real = cpu_profile.median_figures([cpu_profile.engine_figures(r) for r in runs])
        seen = cpu_profile.median_figures([cpu_profile.client_figures(r) for r in runs])
        sim = cpu_engine.simulate(sc, profiles[sc.engine])
        cells = []
        for k, m in (("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "E2E"), ("queue_ms", "queue")):
            if m == "queue" and real[k] < 5.0:  # a few ms of queue is the step boundary, no relative error
                cells.append(f"queue {real[k]:6.1f}/{sim[k]:6.1f}        ")
                continue
            err = sim[k] / real[k] - 1
            if not sc.fit:
                table[m].append(abs(err))
                if m in client:
                    client[m].append(abs(sim[k] / seen[k] - 1))
            cells.append(f"{m} {real[k]:6.1f}/{sim[k]:6.1f} ({err:+6.1%})")
        same = (real["preemptions"] > 0) == (sim["preemptions"] > 0)
        if not sc.fit:
            verdicts.append(same)
        tag = "cal" if sc.fit else "OUT"
        print(f"  [{tag}] {sc.name:16} " + "  ".join(cells) + f"  preemptions {real['preemptions']:.0f}/"
              f"{sim['preemptions']:.0f}{'' if same else ' VERDICT DIFFERS'}  prefix hits "
              f"{real['prefix_hit_rate']:.0%}/{sim['prefix_hit_rate']:.0%}")
        if not sc.fit:
            print(f"  {'':22}{sc.what}; client saw TTFT {seen['ttft_ms']:.1f}, ITL {seen['itl_ms']:.1f}, E2E "
                  f"{seen['e2e_ms']:.1f} ms")
    print("  [cal] = calibration (the profile is fitted on these, simulated here only as a check); [OUT] = held out")
    medians("held-out scenarios, vLLM's own histograms", table)
    medians("held-out scenarios, the client's times (HTTP delivery included, not modelled)", client)
    print(f"  preemption verdict (any / none) agrees in {sum(verdicts)} of {len(verdicts)} held-out scenarios")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record-cpu", action="store_true", help="re-record the CPU engine live and refit its profile")
    ap.add_argument("--fit-gpu", action="store_true", help="refit the async era's constants on the in-sample runs")
    ap.add_argument("--full", action="store_true", help="simulate every H100 run's whole duration (slow)")
    ap.add_argument("--only", choices=["gpu", "cpu"])
    args = ap.parse_args()
    print("Engine simulator vs real vLLM (simulated values are SIMULATED, not measured; [in ] = used to fit)\n")
    if args.fit_gpu:
        print(gpu_runs.fit())
    if args.only != "cpu":
        h100_runs(args.full)
        published_points()
    if args.only != "gpu":
        cpu_engine_runs(args.record_cpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
