"""How fast `oculis sim replay` runs: one simulated hour at 10 requests/s of chat traffic on
Llama-3.1-8B / H100, pinned to one CPU core. Goal: under 30 wall seconds.

    .venv/bin/python bench/sim_replay_speed.py [--seconds 3600] [--rate 10]
Reproduce with the CLI: the same workload file is printed, then `oculis sim replay ... --workload FILE`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from oculis_sim import config, replay, workload

CHAT = {"prompt_tokens": {"distribution": "lognormal", "mean": 1000, "stdev": 500, "min": 16, "max": 8000},
        "output_tokens": {"distribution": "lognormal", "mean": 250, "stdev": 150, "min": 1, "max": 2000}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3600)
    ap.add_argument("--rate", type=float, default=10)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    spec = {**CHAT, "stages": [{"rate": args.rate, "seconds": args.seconds}], "seed": 1}
    path = Path(tempfile.gettempdir()) / "oculis-sim-chat-hour.yaml"
    path.write_text(yaml.safe_dump(spec))
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB")
    wall, cpu = time.perf_counter(), time.process_time()
    wl = workload.load(path)
    res = replay.run(s, wl)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    sm = res.summary
    print(f"workload: {path} ({len(wl)} requests over {args.seconds:.0f} simulated s at {args.rate:g} req/s)")
    print(f"reproduce: oculis sim replay --model {s.model_name} --gpu H100-80GB --workload {path}")
    print(f"SIMULATED: TTFT mean {sm['ttft_ms']['mean']:.1f} ms, ITL mean {sm['itl_ms']['mean']:.2f} ms, "
          f"E2E mean {sm['e2e_ms']['mean']:.0f} ms, {sm['output_tokens_per_s']:.0f} output tok/s, "
          f"peak KV usage {res.peak_kv_usage:.1%}")
    print(f"replay speed: {wall:.1f} wall s ({cpu:.1f} CPU s) on one core for {args.seconds:.0f} simulated s "
          f"= {args.seconds / wall:.0f}x real time; goal < 30 s: {'met' if wall < 30 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
