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
import dataclasses
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

from oculis.upstream import ModelConfig
from oculis_sim import config, replay, steptime
from oculis_sim.workload import Workload

DATA = Path(__file__).parent / "data" / "vllm_cpu_runs.json"
PROFILE = Path(__file__).parent / "data" / "cpu_step_profile.json"
VENV = Path(os.environ.get("OCULIS_VLLM_VENV", "/work/vllm-venv"))
MODEL_DIR = Path(os.environ.get("OCULIS_TINY_MODEL", "/work/tiny-model"))
LOCK = "/tmp/oculis-vllm.lock"
VLLM_CPU = "0.32"  # vllm-cpu 0.32.0: its scheduler's behaviour (full-sequence admission) is what is compared
PORT = 37100
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


def scenarios() -> list[Scenario]:
    rng = np.random.default_rng(24)
    out: list[Scenario] = []
    single = [(i * 1.5, p, 48, -1, 0) for i, p in enumerate([16, 128, 250, 16, 128, 250, 400, 400])]
    out.append(Scenario("single", "roomy", True, tuple(single), "one request at a time: prompts 16-400, 48 out"))
    for c in (4, 8):
        out.append(Scenario(f"concurrent{c}", "roomy", True, tuple((0.0, 16, 64, -1, 0) for _ in range(c)),
                            f"{c} requests at once, 16 in / 64 out"))
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
    out.append(Scenario("preempt", "tiny", False, tuple((0.0, 200, 200, -1, 0) for _ in range(8)),
                        "8 x (200 in, 200 out) at once into 9 usable blocks of 128: preemption"))
    out.append(Scenario("fits", "tiny", False, tuple((0.5 * i, 100, 100, -1, 0) for i in range(4)),
                        "4 x (100 in, 100 out), 0.5 s apart, same tiny cache: fits"))
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


def with_tpot(sc: Scenario, fig: dict[str, Any]) -> dict[str, Any]:
    """Decode time per output token, (E2E - TTFT) / (output - 1) over the scenario's means: under load the API
    server packs several tokens into one streamed chunk, so the gaps between chunks are not per token. The
    simulator's own figure is also its engine-side one (it has no delivery stalls)."""
    out = statistics.fmean(r[2] for r in sc.requests)
    tpot = (fig["e2e_ms"] - fig["ttft_ms"]) / (out - 1)
    return {"engine_tpot_ms": tpot, **fig, "tpot_ms": tpot}


def simulate(sc: Scenario, profile: steptime.FittedSteps) -> dict[str, float]:
    e = ENGINES[sc.engine]
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
            "e2e": stamps[-1] - sent}


async def _run(base: str, sc: Scenario, repeat: int) -> dict[str, Any]:
    prompts = _prompts(sc, repeat)
    async with httpx.AsyncClient(timeout=600) as client:
        before = (await client.get(f"{base}/metrics")).text
        t0 = time.perf_counter() + 0.2
        got = await asyncio.gather(*(_one(client, f"{base}/v1/completions", p, r[2], r[0], t0)
                                     for p, r in zip(prompts, sc.requests, strict=True)))
        await asyncio.sleep(1.0)  # let the engine publish its counters
        after = (await client.get(f"{base}/metrics")).text

    def delta(name: str) -> float:
        return _metric(after, name) - _metric(before, name)

    q = delta("vllm:request_queue_time_seconds_count")
    queries = delta("vllm:prefix_cache_queries_total")
    out = {"ttft_ms": 1000 * statistics.fmean(g["ttft"] for g in got),
            "itl_ms": 1000 * statistics.fmean(x for g in got for x in g["itl"]),
            "e2e_ms": 1000 * statistics.fmean(g["e2e"] for g in got),
            "queue_ms": 1000 * delta("vllm:request_queue_time_seconds_sum") / q if q else 0.0,
            "preemptions": delta("vllm:num_preemptions_total"),
            "prefix_hit_rate": delta("vllm:prefix_cache_hits_total") / queries if queries else 0.0}
    # The engine's own clock (EngineCore timestamps): decode time per token as the scheduler paced it, free of
    # the API server's delivery stalls on this oversubscribed machine.
    decoded = delta("vllm:generation_tokens_total") - delta("vllm:request_decode_time_seconds_count")
    if decoded > 0:
        out["engine_tpot_ms"] = 1000 * delta("vllm:request_decode_time_seconds_sum") / decoded
    if sc.fit:  # calibration: each request's prompt length and TTFT (the prefill slope)
        out["ttft_by_prompt"] = [[len(p), 1000 * g["ttft"]] for p, g in zip(prompts, got, strict=True)]
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


def record(repeats: int = 3, engines: tuple[str, ...] = tuple(ENGINES)) -> dict[str, Any]:
    """Start each engine once (under the shared lock), run its scenarios `repeats` times, keep every run."""
    runs: dict[str, Any] = {}
    blocks: dict[str, int | None] = {}
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for engine in engines:
            with _engine(engine) as nblocks:
                blocks[engine] = nblocks
                base = f"http://127.0.0.1:{PORT}"
                asyncio.run(_run(base, Scenario("warmup", engine, True, ((0.0, 64, 8, -1, 0),) * 2, ""), 99))
                mine = [s for s in scenarios() if s.engine == engine]
                for r in range(repeats):  # round-robin: every scenario sees the machine's load swings alike
                    for sc in mine:
                        runs.setdefault(sc.name, []).append(asyncio.run(_run(base, sc, r)))
                        print(f"recorded {sc.name} #{r}: {runs[sc.name][-1]}", file=sys.stderr, flush=True)
    load = os.getloadavg()
    return {"about": "Real vLLM (vllm-cpu 0.32, V1, CPU backend) serving the tiny random-weight model on this 2-core "
            "machine shared with other jobs: expect CPU timing noise; each scenario repeated, medians compared.",
            "recorded": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_average": load,
            "engines": ENGINES, "engine_kv_blocks": blocks, "runs": runs}


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k, v in runs[0].items() if isinstance(v, int | float)}


def fit_profile(recorded: dict[str, Any]) -> steptime.FittedSteps:
    """The CPU step model from the calibration scenarios only, in closed form from medians over repeats (robust
    to this machine's noise, unlike a joint fit): ITL of one request = step + request; ITL of eight = step +
    8 x request; TTFT of single requests over their prompt length: the prefill slope and, at its intercept
    less one step, the API server's time before the scheduler sees a request; TTFT of eight at once: how much
    of that time the API server spends on one request at a time."""
    runs = recorded["runs"]
    by_name = {s.name: s for s in scenarios()}
    key = "engine_tpot_ms" if all("engine_tpot_ms" in r for r in runs["single"] + runs["concurrent8"]) else "tpot_ms"
    itl1 = medians([with_tpot(by_name["single"], r) for r in runs["single"]])[key] / 1000
    itl8 = medians([with_tpot(by_name["concurrent8"], r) for r in runs["concurrent8"]])[key] / 1000
    request = max(0.0, (itl8 - itl1) / 7)
    step = max(itl1 - request, 1e-4)
    pairs = [(p, t / 1000) for r in runs["single"] for p, t in r.get("ttft_by_prompt", [])]
    slope, intercept = 0.0, medians(runs["single"])["ttft_ms"] / 1000
    if len({p for p, _ in pairs}) >= 2:
        by_len: dict[int, list[float]] = {}
        for p, t in pairs:
            by_len.setdefault(p, []).append(t)
        xs = sorted(by_len)
        ys = [statistics.median(by_len[x]) for x in xs]  # medians per length: one noisy request moves nothing
        slope, intercept = np.polyfit(xs, ys, 1)
        slope = max(0.0, float(slope))
        intercept = float(intercept)
    # Eight at once: the API server takes them one after another, so their mean TTFT exceeds one request's by
    # 3.5 times its serial work per request (the engine adds little: 8 x 16 prompt tokens fit one step).
    ttft8 = medians(runs["concurrent8"])["ttft_ms"] / 1000
    ttft1 = intercept + 16 * slope
    serial = max(0.0, (ttft8 - ttft1) / 3.5)
    api = max(0.0, intercept - step - request - serial)
    return steptime.FittedSteps(step_s=step, request_s=request, prefill_token_s=slope, decode_token_s=0.0, api_s=api,
                                api_serial_s=serial,
                                source="bench/cpu_engine.py fit_profile on the single and concurrent8 scenarios")


def load_profile() -> steptime.FittedSteps:
    return steptime.FittedSteps(**json.loads(PROFILE.read_text()))


def save_profile(p: steptime.FittedSteps) -> None:
    PROFILE.write_text(json.dumps(dataclasses.asdict(p), indent=1) + "\n")
