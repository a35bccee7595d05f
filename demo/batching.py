"""The demo's batching trade-off: `oculis sim replay` over chat, RAG and batch traffic shapes with
max_num_seqs / max_num_batched_tokens settings side by side. SIMULATED figures, not measurements.

Each setting is filled as a load test fills it (vLLM bench's --max-concurrency = max_num_seqs, more
requests than that waiting): a larger batch buys throughput at the price of TTFT and ITL, until the
running sequences no longer fit the KV cache; past that ceiling vLLM preempts (recomputes) and the
extra batch stops paying. The KV ceiling column is the KV cache's tokens over the shape's mean
sequence length.

    python demo/batching.py [--model M] [--gpu G] [--oculis PATH]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

SHAPES: dict[str, dict[str, Any]] = {  # mean prompt / output tokens of each traffic shape
    "chat": {"prompt_tokens": {"mean": 600, "stdev": 300, "min": 32, "max": 2048},
             "output_tokens": {"mean": 250, "stdev": 120, "min": 16, "max": 1024}, "seed": 1},
    "rag": {"prompt_tokens": {"mean": 3500, "stdev": 800, "min": 1000, "max": 7000},
            "output_tokens": {"mean": 200, "stdev": 80, "min": 16, "max": 512},
            "shared_prefix_tokens": 300, "seed": 2},
    "batch": {"prompt_tokens": {"mean": 1200, "stdev": 400, "min": 128, "max": 4096},
              "output_tokens": {"mean": 700, "stdev": 300, "min": 64, "max": 2048}, "seed": 3},
}
SETTINGS = [(16, 2048), (64, 4096), (256, 8192), (1024, 16384)]  # (max_num_seqs, max_num_batched_tokens)


def workload(shape: str, seqs: int) -> dict[str, Any]:
    # Enough requests to keep the batch full well past its first wave.
    return {**SHAPES[shape], "stages": [{"rate": "inf", "requests": max(400, 4 * seqs)}], "max_concurrency": seqs}


def mean_sequence(shape: str) -> float:
    s = SHAPES[shape]
    return float(s["prompt_tokens"]["mean"] + s.get("shared_prefix_tokens", 0) + s["output_tokens"]["mean"])


def replay(oculis: str, model: str, gpu: str, shape: str, seqs: int, tokens: int, tmp: Path) -> dict[str, Any]:
    path = tmp / f"{shape}-{seqs}.yaml"
    doc = workload(shape, seqs)
    doc["stages"][0]["rate"] = float("inf")
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.run([oculis, "sim", "replay", "--model", model, "--gpu", gpu, "--max-num-seqs", str(seqs),
                           "--max-num-batched-tokens", str(tokens), "--max-model-len", "8192",
                           "--workload", str(path), "-o", "json"], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo/batching: oculis sim replay failed: {proc.stderr.strip()}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def table(model: str, gpu: str, rows: list[tuple[str, int, int, dict[str, Any]]]) -> str:
    lines = [f"SIMULATED (oculis sim replay, not measured): {model} on {gpu}, each setting filled with "
             "max_num_seqs concurrent requests",
             f"{'shape':6} {'prompt/out':>10} {'KV fits':>8} {'max_num_seqs':>12} {'batched_tok':>11} "
             f"{'out tok/s':>9} {'TTFT ms':>8} {'ITL ms':>7} {'preemptions':>11}"]
    last = ""
    for shape, seqs, tokens, r in rows:
        s = SHAPES[shape]
        fits = r["kv_blocks"] * 16 / mean_sequence(shape)
        head = (f"{shape:6} {s['prompt_tokens']['mean']:>5}/{s['output_tokens']['mean']:<4} {fits:>8.0f}"
                if shape != last else f"{'':6} {'':>10} {'':>8}")
        last = shape
        mark = "  <- past the KV ceiling: preempting" if r["preemptions"] else ""
        lines.append(f"{head} {seqs:>12} {tokens:>11} {r['output_tokens_per_s']:>9.0f} "
                     f"{r['ttft_ms']['mean']:>8.0f} {r['itl_ms']['mean']:>7.1f} {r['preemptions']:>11}{mark}")
    lines.append("A larger batch buys throughput with TTFT and ITL; once the running sequences outgrow the KV "
                 "cache the engine preempts (recomputes) and throughput stops rising or falls.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo/batching.py", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    p.add_argument("--gpu", default="H100-80GB")
    p.add_argument("--oculis", default=str(Path(sys.executable).with_name("oculis")))
    args = p.parse_args(argv)
    jobs = [(shape, seqs, tokens) for shape in SHAPES for seqs, tokens in SETTINGS]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(2) as pool:
        def one(job: tuple[str, int, int]) -> dict[str, Any]:
            return replay(args.oculis, args.model, args.gpu, job[0], job[1], job[2], Path(tmp))

        results = list(pool.map(one, jobs))
    print(table(args.model, args.gpu, [(*j, r) for j, r in zip(jobs, results, strict=True)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
