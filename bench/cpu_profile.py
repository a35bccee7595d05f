"""Fit a CPU step profile (`oculis_sim.steptime.FittedSteps`) from an engine session's calibration runs only.

The figures are vLLM's own (its Prometheus histograms, read before and after each run): they are timed by
the engine and its front end, so the HTTP delivery to the client, which on a small shared machine stalls
and packs whole streams, does not enter the fit. Each quantity comes from the runs that isolate it:

- decode: `decodeB` (B requests of 16 prompt tokens at once): decode time per token = one step of B
  decodes = step_s + request_s x B, a straight line over B (least squares);
- prefill: `prefillP` (one request of P tokens at a time): prefill time = the steps of its chunks (the token
  budget splits P); less the per-step and per-request CPU known from decode, what is left is
  the first step's extra (adding the request to the persistent batch) + prefill_token_s x P + pair_s x
  attention pairs, fitted non-negative; whether that extra is paid per request, per step some join, or per
  step whose batch changed (joined or left) is chosen by simulating the `decodeB` runs;
- the API server: TTFT - queue - prefill of a lone request is its path from the HTTP handler into the
  engine and the first token's way back (api_s); with B sent at once the last waits for the B - 1 before
  it, api_s + api_serial_s x (B - 1) / 2 on average (least squares over B).

    .venv/bin/python bench/cpu_profile.py bench/data/vllm_cpu_runs.json --engine roomy -o profile.json
    .venv/bin/oculis sim replay --step-profile profile.json ...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import cpu_engine
import numpy as np
from scipy.optimize import nnls

from oculis_sim import steptime

Figures = dict[str, float]


def engine_figures(run: dict[str, Any]) -> Figures:
    """One run's means from the engine's histograms (ms): TTFT, ITL, E2E, queue, prefill and decode per token."""
    e = run["engine"]

    def mean(name: str) -> float:
        n = e[f"vllm:{name}_count"]
        return 1000 * e[f"vllm:{name}_sum"] / n if n else 0.0

    decoded = e["vllm:generation_tokens_total"] - e["vllm:request_decode_time_seconds_count"]
    return {"ttft_ms": mean("time_to_first_token_seconds"), "itl_ms": mean("inter_token_latency_seconds"),
            "e2e_ms": mean("e2e_request_latency_seconds"), "queue_ms": mean("request_queue_time_seconds"),
            "prefill_ms": mean("request_prefill_time_seconds"),
            "tpot_ms": 1000 * e["vllm:request_decode_time_seconds_sum"] / decoded if decoded > 0 else 0.0,
            "preemptions": e["vllm:num_preemptions_total"],
            "prefix_hit_rate": (e["vllm:prefix_cache_hits_total"] / e["vllm:prefix_cache_queries_total"]
                                if e["vllm:prefix_cache_queries_total"] else 0.0)}


def client_figures(run: dict[str, Any]) -> Figures:
    """The client's view of the same run (ms): means over requests of TTFT and E2E, ITL over all chunk gaps."""
    reqs = run["requests"]
    gaps = [b - a for q in reqs for a, b in zip(q[3], q[3][1:], strict=False)]
    return {"ttft_ms": statistics.fmean(q[3][0] for q in reqs), "e2e_ms": statistics.fmean(q[3][-1] for q in reqs),
            "itl_ms": statistics.fmean(gaps) if gaps else 0.0}


def median_figures(runs: list[Figures]) -> Figures:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def chunks(prompt: int, budget: int) -> list[int]:
    """The prefill chunks of a lone request: the token budget fills each step."""
    return [min(budget, prompt - s) for s in range(0, prompt, budget)]


def pairs(prompt: int, budget: int) -> float:
    """Attention pairs of a lone request's prefill, as the scheduler counts them (new x (context + new / 2))."""
    out, done = 0.0, 0
    for c in chunks(prompt, budget):
        out += c * (done + c / 2)
        done += c
    return out


def fit(recorded: dict[str, Any], engine: str = "roomy") -> steptime.FittedSteps:
    """The profile of one engine session, from its calibration runs (medians over repeats)."""
    runs = recorded["runs"]
    engines = recorded.get("engines", cpu_engine.ENGINES)  # the settings the recording ran with
    budget = engines[engine]["max_num_batched_tokens"]
    tag = "" if engine == "roomy" else f".{engine}"

    def figs(name: str) -> Figures:
        return median_figures([engine_figures(r) for r in runs[name + tag]])

    batches = [b for b in cpu_engine.DECODE_BATCHES if f"decode{b}{tag}" in runs]
    dec = [figs(f"decode{b}")["tpot_ms"] / 1000 for b in batches]
    request, step = np.polyfit(batches, dec, 1) if len(batches) > 1 else (0.0, dec[0])
    request = max(0.0, float(request))
    step = max(1e-5, float(step) if request > 0 else statistics.fmean(dec))
    lengths = [p for p in cpu_engine.PREFILL_LENGTHS if f"prefill{p}{tag}" in runs]
    pre = {p: figs(f"prefill{p}") for p in lengths}
    # prefill time less the per-step CPU of its chunks; what is left: new request + tokens + attention pairs
    rest = np.array([pre[p]["prefill_ms"] / 1000 - len(chunks(p, budget)) * (step + request) for p in lengths])
    a = np.array([[1.0, p, pairs(p, budget)] for p in lengths])
    scale = a.max(axis=0)
    (new, token, pair), _ = nnls(a / scale, rest)
    new, token, pair = new / scale[0], token / scale[1], pair / scale[2]
    lone = statistics.median((f["ttft_ms"] - f["queue_ms"] - f["prefill_ms"]) / 1000 for f in pre.values())
    base = steptime.FittedSteps(
        step_s=step, request_s=request, prefill_token_s=float(token), decode_token_s=0.0, pair_s=float(pair),
        api_s=lone, source=f"bench/cpu_profile.py on the calibration runs of engine {engine!r} recorded "
        f"{recorded['recorded']}")
    # B requests sent at once (`decodeB`, B > 1) tell the rest, by simulating them: how long the API server works
    # on one request before the next (api_serial_s; a lone request pays it too, so it comes out of api_s), and
    # what the extra cost of a request's first step is paid for: each request joining, each step some join, or
    # each step whose batch changed (joined or left; the B requests of these runs leave at different steps).
    shapes = {s.name: s for s in cpu_engine.calibration(engine)}
    burst = [(shapes[f"decode{b}{tag}"], figs(f"decode{b}")) for b in batches if b > 1]
    best: tuple[float, steptime.FittedSteps] | None = None
    for paid in ("new_request_s", "join_s", "batch_change_s"):
        for serial in np.arange(0.0, min(lone, 0.01) + 1e-9, 0.25e-3):
            cand = dataclasses.replace(base, api_s=lone - float(serial), api_serial_s=float(serial),
                                       **{paid: float(new)})
            err = 0.0
            for sc, real in burst:
                sim = cpu_engine.simulate(sc, cand, engines)
                err += (sim["ttft_ms"] / real["ttft_ms"] - 1) ** 2 + (sim["e2e_ms"] / real["e2e_ms"] - 1) ** 2
            if best is None or err < best[0] - 1e-12:
                best = (err, cand)
    return best[1] if best else dataclasses.replace(base, join_s=float(new))


def recording_problem(recorded: Any, engine: str) -> str | None:
    """Why `fit` cannot read this engine session from the file (a KeyError deep in the fit otherwise), or None."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("runs"), dict) or "recorded" not in recorded:
        return "not a CPU recording (no runs by name); record one with `bench/sim_validation.py --record-cpu`"
    engines = recorded.get("engines", cpu_engine.ENGINES)
    tag = "" if engine == "roomy" else f".{engine}"
    if engine not in engines or not any(f"decode{b}{tag}" in recorded["runs"] for b in cpu_engine.DECODE_BATCHES):
        return f"--engine {engine!r}: no calibration runs of it; use one of {', '.join(sorted(engines))}"
    return None


def save(p: steptime.FittedSteps, path: Path) -> None:
    path.write_text(json.dumps(dataclasses.asdict(p), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recording", type=Path, help="a recording written by `bench/sim_validation.py --record-cpu`")
    ap.add_argument("--engine", default="roomy", help="which engine session of the recording (default roomy)")
    ap.add_argument("-o", "--output", type=Path, help="write the profile here (default: print it)")
    args = ap.parse_args(argv)
    try:
        recorded = json.loads(args.recording.read_text())
    except (OSError, ValueError) as exc:  # unreadable, not UTF-8, not JSON
        why = exc.strerror if isinstance(exc, OSError) else f"not a JSON recording ({exc})"
        ap.error(f"recording {args.recording}: {why}; give the file "
                 "`bench/sim_validation.py --record-cpu` wrote, e.g. bench/data/vllm_cpu_runs.json")
    if problem := recording_problem(recorded, args.engine):
        ap.error(f"recording {args.recording}: {problem}")
    prof = fit(recorded, args.engine)
    if args.output:
        try:
            save(prof, args.output)
        except OSError as exc:
            ap.error(f"--output {args.output}: {exc.strerror}; give a writable file path")
    else:
        print(json.dumps(dataclasses.asdict(prof), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
