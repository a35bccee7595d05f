"""The real vLLM engine on this machine's CPU as the scheduler's reference: scenarios, recording, replay.

Scenarios are exact request lists (token-id prompts, ignore_eos outputs, planned send times), so the
simulator replays the very shapes the engine served. Calibration scenarios (single requests, fixed
concurrency) fit the CPU step-time profile (`oculis_sim.steptime.FittedSteps`); the load scenarios
(Poisson, bursts, shared prefixes, chunked prefills, a tiny KV cache that forces preemption) are only
compared, never fitted. Recording needs the shared engine virtualenv and tiny model
(../shared/notes/vllm-on-cpu.md) and holds /tmp/oculis-vllm.lock while an engine runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import re
import statistics
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from oculis.engine import ModelConfig
from oculis_sim import config, replay, steptime
from oculis_sim.workload import Workload

DATA = Path(__file__).parent / "data" / "vllm_cpu_runs.json"
PROFILE = Path(__file__).parent / "data" / "cpu_step_profile.json"
VENV = Path(os.environ.get("OCULIS_VLLM_VENV", "/work/vllm-venv"))
MODEL_DIR = Path(os.environ.get("OCULIS_TINY_MODEL", "/work/tiny-model"))
LOCK = "/tmp/oculis-vllm.lock"
VLLM_CPU = "0.32"  # vllm-cpu 0.32.0: its scheduler's behaviour (full-sequence admission) is what is compared
PORT = int(os.environ.get("OCULIS_CPU_ENGINE_PORT", "34100"))
BLOCK = 128  # vLLM's CPU backend block size
VOCAB = 4000  # token ids drawn below the tiny model's 4,096-entry vocabulary
MAX_LEN = 512
# The tiny model (/work/tiny-model/config.json): LlamaForCausalLM, hidden 256, 2 layers, 4 heads, 2 KV heads,
# head 64, MLP 512, vocabulary 4,096 (3.28 M parameters).
TINY = ModelConfig(params_billions=0.00328, num_layers=2, hidden_size=256, num_attention_heads=4, num_kv_heads=2,
                   head_dim=64, vocab_size=4096, max_position_embeddings=2048, intermediate_size=512)
KV_BYTES_PER_BLOCK = BLOCK * 2 * TINY.num_layers * TINY.num_kv_heads * TINY.head_dim * 2
ENGINES: dict[str, dict[str, int]] = {
    # roomy cache (REALENGINE.md's VLLM_CPU_KVCACHE_SPACE=1: 1 GiB, 8,192 blocks), small token budget:
    # prompts over 256 tokens are prefilled in chunks
    "roomy": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "kv_blocks": 8192},
    # ten blocks of 128 tokens for eight sequences of up to four blocks: preemption
    "tiny": {"max_num_seqs": 8, "max_num_batched_tokens": 256, "kv_blocks": 10},
    # a 64-token budget: every prompt is prefilled in chunks, mixed with the running decodes
    "chunky": {"max_num_seqs": 8, "max_num_batched_tokens": 64, "kv_blocks": 8192},
}


@dataclass(frozen=True)
class Scenario:
    name: str
    engine: str
    fit: bool  # calibration (fits the CPU profile) or held-out comparison
    # per request: (send time s, prompt tokens, output tokens, prefix group or -1, prefix tokens)
    requests: tuple[tuple[float, int, int, int, int], ...]
    what: str


def _poisson(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    t = np.cumsum(rng.exponential(1 / rate, n))
    return t - t[0]


PREFILL_LENGTHS = (16, 128, 256, 384, 500)
DECODE_BATCHES = (1, 2, 4, 8)


def calibration(engine: str) -> list[Scenario]:
    """Calibration runs, recorded in each engine's session right before its held-out runs (same process, same
    minutes), each a shape the engine's own histograms describe exactly: `prefillP`, three requests of P prompt
    tokens one at a time (the prefill time of P tokens, chunked where P exceeds the token budget), and
    `decodeB`, B requests at once (the decode step of a batch of B). Only these fit a profile."""
    tag = "" if engine == "roomy" else f".{engine}"
    out = [Scenario(f"prefill{p}{tag}", engine, True, tuple((0.3 * i, p, 8, -1, 0) for i in range(3)),
                    f"3 x ({p} in, 8 out), one at a time") for p in PREFILL_LENGTHS]
    out += [Scenario(f"decode{b}{tag}", engine, True, tuple((0.0, 16, 64, -1, 0) for _ in range(b)),
                     f"{b} x (16 in, 64 out) at once") for b in DECODE_BATCHES]
    return out


def scenarios() -> list[Scenario]:
    rng = np.random.default_rng(24)
    out: list[Scenario] = calibration("roomy")
    n = 30
    at = _poisson(rng, n, 3.0)
    out.append(Scenario("poisson", "roomy", False, tuple(
        (float(t), int(rng.integers(32, 400)), int(rng.integers(16, 96)), -1, 0) for t in at),
        "Poisson 3 req/s, prompts 32-400, outputs 16-96"))
    bursts = [(3.0 * b, int(rng.integers(64, 300)), int(rng.integers(32, 64)), -1, 0) for b in range(3)
              for _ in range(10)]
    out.append(Scenario("bursts", "roomy", False, tuple(bursts), "3 bursts of 10 every 3 s (max_num_seqs 8)"))
    at = _poisson(rng, 24, 3.0)
    out.append(Scenario("prefix", "roomy", False, tuple(
        (float(t), 256 + int(rng.integers(64, 160)), int(rng.integers(16, 64)), int(rng.integers(0, 3)), 256)
        for t in at), "3 shared prefixes of 256 tokens (2 blocks) + 64-160 own, Poisson 3 req/s"))
    at = _poisson(rng, 8, 1.5)
    out.append(Scenario("chunked", "roomy", False, tuple((float(t), 480, 32, -1, 0) for t in at),
                        "480-token prompts over a 256-token budget (2 chunks), Poisson 1.5 req/s"))
    at = _poisson(rng, 40, 8.0)
    out.append(Scenario("poisson8", "roomy", False, tuple(
        (float(t), int(rng.integers(16, 300)), int(rng.integers(16, 128)), -1, 0) for t in at),
        "Poisson 8 req/s (past saturation), prompts 16-300, outputs 16-128"))
    out += calibration("tiny")
    out.append(Scenario("preempt", "tiny", False, tuple((0.0, 200, 200, -1, 0) for _ in range(8)),
                        "8 x (200 in, 200 out) at once into 9 usable blocks of 128: preemption"))
    out.append(Scenario("fits", "tiny", False, tuple((0.5 * i, 100, 100, -1, 0) for i in range(4)),
                        "4 x (100 in, 100 out), 0.5 s apart, same tiny cache: fits"))
    at = _poisson(rng, 16, 4.0)
    out.append(Scenario("pressure", "tiny", False, tuple(
        (float(t), int(rng.integers(100, 300)), int(rng.integers(64, 200)), -1, 0) for t in at),
        "Poisson 4 req/s, prompts 100-300, outputs 64-200 into 9 blocks: queueing and preemption"))
    out += calibration("chunky")
    at = _poisson(rng, 24, 3.0)
    out.append(Scenario("chunky", "chunky", False, tuple(
        (float(t), int(rng.integers(64, 480)), int(rng.integers(16, 96)), -1, 0) for t in at),
        "64-token budget: prompts 64-480 prefilled in 1-8 chunks beside the decodes, Poisson 3 req/s"))
    return out


def _prompts(sc: Scenario, repeat: int) -> list[list[int]]:
    """Token ids: unique per scenario and repeat (no cache hits across them); a prefix group shares its ids."""
    rng = np.random.default_rng(zlib.crc32(f"{sc.name}/{repeat}".encode()))
    groups: dict[int, list[int]] = {}
    prompts = []
    for _, p, _, g, plen in sc.requests:
        if g >= 0 and g not in groups:
            groups[g] = rng.integers(10, VOCAB, plen).tolist()
        head = groups[g] if g >= 0 else []
        prompts.append(head + rng.integers(10, VOCAB, p - len(head)).tolist())
    return prompts


def simulate(sc: Scenario, profile: steptime.FittedSteps,
             engines: dict[str, dict[str, int]] | None = None) -> dict[str, float]:
    """engines: the engine settings a recording names (default this file's)."""
    e = (engines or ENGINES)[sc.engine]
    s = config.resolve("tiny", "CPU", model_config=TINY, max_num_seqs=e["max_num_seqs"],
                       max_num_batched_tokens=e["max_num_batched_tokens"], max_model_len=str(MAX_LEN),
                       num_gpu_blocks_override=e["kv_blocks"], block_size=BLOCK, step_profile=profile,
                       vllm_version=VLLM_CPU)
    r = sc.requests
    prefix = max(x[4] for x in r)
    wl = Workload(np.array([x[0] for x in r]), np.array([x[1] for x in r]), np.array([x[2] for x in r]), prefix,
                  None, np.array([max(x[3], 0) for x in r]) if prefix else None)
    res = replay.run(s, wl)
    sm = res.summary
    return {"ttft_ms": sm["ttft_ms"]["mean"], "itl_ms": sm["itl_ms"]["mean"], "e2e_ms": sm["e2e_ms"]["mean"],
            "queue_ms": res.queue_ms["mean"], "preemptions": sm["preemptions"], "prefix_hit_rate": res.prefix_hit_rate}


# ---- recording (the real engine) ----

def _metric(text: str, name: str) -> float:
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


async def _one(client: httpx.AsyncClient, url: str, prompt: list[int], out: int, delay: float,
               t0: float) -> dict[str, Any]:
    await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
    sent = time.perf_counter()
    stamps: list[float] = []
    body = {"model": "tiny", "prompt": prompt, "max_tokens": out, "ignore_eos": True, "stream": True,
            "temperature": 0.0}
    async with client.stream("POST", url, json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                    stamps.append(time.perf_counter())
    return {"ttft": stamps[0] - sent, "itl": [b - a for a, b in itertools.pairwise(stamps)],
            "e2e": stamps[-1] - sent, "sent": sent - t0, "stamps": [round(1000 * (x - sent), 2) for x in stamps]}


# what each run keeps of the engine's own figures (deltas over the run); bench/cpu_profile.py reads them
ENGINE_SERIES = [f"vllm:{h}_{x}" for h in (
    "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
    "request_inference_time_seconds", "time_to_first_token_seconds", "inter_token_latency_seconds",
    "e2e_request_latency_seconds", "iteration_tokens_total", "request_num_preemptions") for x in ("sum", "count")] + [
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"]


async def _run(base: str, sc: Scenario, repeat: int) -> dict[str, Any]:
    prompts = _prompts(sc, repeat)
    async with httpx.AsyncClient(timeout=600) as client:
        before = (await client.get(f"{base}/metrics")).text
        t0 = time.perf_counter() + 0.2
        got = await asyncio.gather(*(_one(client, f"{base}/v1/completions", p, r[2], r[0], t0)
                                     for p, r in zip(prompts, sc.requests, strict=True)))
        await asyncio.sleep(0.5)  # let the engine publish its counters
        after = (await client.get(f"{base}/metrics")).text

    def delta(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    q = delta("vllm:request_queue_time_seconds_count")
    queries = delta("vllm:prefix_cache_queries_total")
    # the client's means (a first look while recording; the comparison reads "requests" and "engine")
    out = {"ttft_ms": 1000 * statistics.fmean(g["ttft"] for g in got),
            "itl_ms": 1000 * statistics.fmean(x for g in got for x in g["itl"]),
            "e2e_ms": 1000 * statistics.fmean(g["e2e"] for g in got),
            "queue_ms": 1000 * delta("vllm:request_queue_time_seconds_sum") / q if q else 0.0,
            "preemptions": delta("vllm:num_preemptions_total"),
            "prefix_hit_rate": delta("vllm:prefix_cache_hits_total") / queries if queries else 0.0}
    # raw: per request its send time (s after the scenario's start), prompt and output length, and the client
    # times (ms after sending) of every streamed chunk; the engine's own sums and counts of its histograms
    out["requests"] = [[round(g["sent"], 4), len(p), r[2], g["stamps"]] for p, r, g in zip(prompts, sc.requests, got,
                                                                                          strict=True)]
    out["engine"] = {n: delta(n) for n in ENGINE_SERIES}
    return out


@contextlib.contextmanager
def _engine(name: str) -> Any:
    e = ENGINES[name]
    # /work/REALENGINE.md's start command (eager: no 30-50 s compile per start), plus the scenario's engine flags;
    # --kv-cache-memory-bytes of N blocks gives num_gpu_blocks N, one of them vLLM's null block.
    # VLLM_CPU_KVCACHE_SPACE wins over --kv-cache-memory-bytes on the CPU backend: set one or the other.
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    cmd = [str(VENV / "bin" / "vllm"), "serve", str(MODEL_DIR), "--served-model-name", "tiny", "--max-model-len",
           str(MAX_LEN), "--dtype", "bfloat16", "--host", "127.0.0.1", "--port", str(PORT), "--enforce-eager",
           "--max-num-seqs", str(e["max_num_seqs"]), "--max-num-batched-tokens", str(e["max_num_batched_tokens"])]
    if e["kv_blocks"] == 8192:
        env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    else:
        cmd += ["--kv-cache-memory-bytes", str(e["kv_blocks"] * KV_BYTES_PER_BLOCK)]
    log = open(f"/tmp/oculis-simtime-engine-{name}.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 600  # a loaded machine took 224 s (REALENGINE.md)
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"engine {name} exited {proc.returncode}: see {log.name}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                    break
            time.sleep(2)
        else:
            raise RuntimeError(f"engine {name} not healthy after 600 s: see {log.name}")
        text = httpx.get(f"http://127.0.0.1:{PORT}/metrics").text
        m = re.search(r'num_gpu_blocks="(\d+)"', text)
        yield int(m.group(1)) if m else None
    finally:
        os.killpg(proc.pid, 15)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        log.close()


def dump(recording: dict[str, Any]) -> str:
    """Compact JSON, one run per line (the token times make the file large)."""
    head = {k: v for k, v in recording.items() if k != "runs"}
    lines = [json.dumps(head)[:-1] + ', "runs": {']
    names = list(recording["runs"])
    for i, name in enumerate(names):
        runs = recording["runs"][name]
        lines.append(f" {json.dumps(name)}: [")
        lines += [f"  {json.dumps(r)}{',' if j < len(runs) - 1 else ''}" for j, r in enumerate(runs)]
        lines.append(" ]" + ("," if i < len(names) - 1 else ""))
    return "\n".join(lines) + "\n}}\n"


def record(repeats: int = 3, engines: tuple[str, ...] = tuple(ENGINES), save: Path | None = None) -> dict[str, Any]:
    """Start each engine once (under the shared lock), run its calibration then its held-out scenarios `repeats`
    times round-robin, keep every run; with `save`, write what is recorded after each engine."""
    runs: dict[str, Any] = {}
    blocks: dict[str, int | None] = {}
    load_before = os.getloadavg()
    with contextlib.suppress(PermissionError):  # ahead of other jobs on a shared machine (root only; else as is)
        os.nice(-10)
    out: dict[str, Any] = {}
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for engine in engines:
            with _engine(engine) as nblocks:
                blocks[engine] = nblocks
                base = f"http://127.0.0.1:{PORT}"
                for _ in range(3):  # first requests pay one-off warm-up costs
                    asyncio.run(_run(base, Scenario("warmup", engine, True, ((0.0, 300, 16, -1, 0),) * 4, ""), 99))
                mine = [s for s in scenarios() if s.engine == engine]
                for r in range(repeats):  # round-robin: every scenario sees the machine's load swings alike
                    for sc in mine:
                        runs.setdefault(sc.name, []).append(asyncio.run(_run(base, sc, r)))
                        short = {k: v for k, v in runs[sc.name][-1].items() if isinstance(v, float)}
                        print(f"recorded {sc.name} #{r}: {short}", file=sys.stderr, flush=True)
            out = {"about": "Real vLLM (vllm-cpu 0.32, V1, CPU backend, --enforce-eager) serving the tiny "
                   f"random-weight model on this machine ({os.cpu_count()} cores); each engine started once, its "
                   "calibration scenarios (fit: true) recorded in the same session right before its held-out "
                   f"ones, round-robin over {repeats} repeats.",
                   "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average_before": load_before,
                   "load_average": os.getloadavg(), "nice": os.nice(0), "engines": ENGINES, "engine_kv_blocks": blocks,
                   "calibration": sorted({s.name for s in scenarios() if s.fit} & set(runs)),
                   "held_out": sorted({s.name for s in scenarios() if not s.fit} & set(runs)), "runs": runs}
            if save:
                save.write_text(dump(out))
    return out
