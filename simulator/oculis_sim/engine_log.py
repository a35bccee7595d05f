"""The lines vLLM logs that tools grep for (start-up KV size, the periodic engine line), marked simulated."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING

from oculis_sim import versions
from oculis_sim.config import Settings

if TYPE_CHECKING:
    from oculis_sim.server import SimServer


def startup_lines(s: Settings) -> list[str]:
    """What vLLM logs at start (the lines tools grep for), marked as simulated."""
    return [
        f"oculis sim serve: SIMULATED vLLM engine (oculis-simulator, no GPU): {s.model_name} on {s.gpu.key} x{s.tp}; "
        f"max_num_seqs {s.max_num_seqs}, max_num_batched_tokens {s.max_num_batched_tokens}, "
        f"max_model_len {s.max_model_len}; timed as vLLM {s.vllm_version[0]}.{s.vllm_version[1]} "
        f"({versions.described(s.vllm_version)}){', fitted --step-profile' if s.step_profile else ''}",
        f"INFO (simulated) GPU KV cache size: {s.kv_cache_tokens:,} tokens",
        f"INFO (simulated) Maximum concurrency for {s.max_model_len:,} tokens per request: "
        f"{s.kv_cache_tokens / s.max_model_len:.2f}x",
    ]


async def log_stats(sim: SimServer, interval: float = 10.0) -> None:
    """vLLM's periodic engine line (vllm#37307 wording), while there is traffic."""
    c = sim.core.counters
    last = (c.prompt_tokens, c.generation_tokens, c.prefix_queries, c.prefix_hits)
    while True:
        await asyncio.sleep(interval)
        now = (c.prompt_tokens, c.generation_tokens, c.prefix_queries, c.prefix_hits)
        sched = sim.core.scheduler
        if now == last and not sched.has_work():
            continue
        queries = now[2] - last[2]
        hit = (now[3] - last[3]) / queries if queries else 0.0
        print(f"INFO (simulated) Engine 000: Avg prompt throughput: {(now[0] - last[0]) / interval:.1f} tokens/s, "
              f"Avg generation throughput: {(now[1] - last[1]) / interval:.1f} tokens/s, Running: "
              f"{len(sched.running)} reqs, Waiting: {len(sched.waiting)} reqs, GPU KV cache usage: "
              f"{sched.usage():.1%}, Prefix cache hit rate: {hit:.1%}", file=sys.stderr, flush=True)
        last = now
