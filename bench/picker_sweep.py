"""The picker sweep of bench/endpoint_picking.py: every picker on a grid of fleet shapes, each cell's TTFT
p90/p99 as a ratio to the best cache-blind picker (random, round-robin) on the same arrivals.

Factors (issue 30): replicas 2/4/8/16; load 30/60/90 % of the fleet's capacity; shared prefix 0/128/1k/8k
tokens; outputs 50/300/3,000 tokens; Poisson or bursty (gamma shape 0.25) arrivals; single-turn or
multi-turn. The full cross product is 576 cells; by default a Latin-hypercube subset (every level of every
factor equally often, seeded), `--full` for all of them.

Capacity is the engine's own, from its step-time model (no measured constant): a replica serves at most
one request per (its uncached prefill + its output x one decode step of a full batch / the batch), the
batch being max_num_seqs or what the KV cache holds of the workload's mean request. Every cell is
Llama-3.1-8B on H100 with max_num_seqs 128 (the issue's engine), `--requests` arrivals per cell.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

from oculis_router.picking import STRATEGIES
from oculis_sim import config, fleet, workload
from oculis_sim.engine import EngineCore

REPLICAS = (2, 4, 8, 16)
LOADS = (0.3, 0.6, 0.9)
PREFIXES = (0, 128, 1024, 8192)
OUTPUTS = (50, 300, 3000)
ARRIVALS = ("poisson", "bursty")
TURNS = ("single", "multi")
BLIND = ("random", "round-robin")
MODEL, GPU, SEQS = "meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", 128
QUESTION = {"mean": 256, "stdev": 64, "min": 16, "max": 1024}


@dataclass(frozen=True)
class Cell:
    replicas: int
    load: float
    prefix: int
    output: int
    arrivals: str
    turns: str

    @property
    def label(self) -> str:
        return (f"{self.replicas:>2}r {self.load:.0%} load, prefix {self.prefix:>4}, out {self.output:>4}, "
                f"{self.arrivals:7} {self.turns}")

    @property
    def shared(self) -> bool:
        """Whether anything is there to share (a prefix, or a conversation's history)."""
        return self.prefix > 0 or self.turns == "multi"


def grid(full: bool, cells: int, seed: int) -> list[Cell]:
    """All cells, or `cells` of them as a Latin hypercube: each factor's levels repeated evenly and shuffled
    independently, so every level of every factor is run equally often."""
    factors = (REPLICAS, LOADS, PREFIXES, OUTPUTS, ARRIVALS, TURNS)
    if full:
        return [Cell(*c) for c in itertools.product(*factors)]
    rng = random.Random(seed)
    cols = []
    for levels in factors:
        col = [levels[i % len(levels)] for i in range(cells)]
        rng.shuffle(col)
        cols.append(col)
    return [Cell(*row) for row in zip(*cols, strict=True)]  # type: ignore[arg-type]


def spec(c: Cell, requests: int, rate: float) -> dict[str, Any]:
    out = {"mean": c.output, "stdev": max(1, c.output // 4), "min": 1, "max": 2 * c.output}
    if c.turns == "multi":  # ~4 turns per conversation: N / 16 groups of 4 users
        groups: dict[str, Any] = {"count": max(1, requests // 16), "tokens": c.prefix, "users_per_group": 4,
                                  "multi_turn": True}
    else:  # 8 system prompts per replica
        groups = {"count": 8 * c.replicas, "tokens": c.prefix}
    d: dict[str, Any] = {"prompt_tokens": QUESTION, "output_tokens": out,
                         "stages": [{"rate": rate, "requests": requests}], "seed": 1,
                         "burstiness": 0.25 if c.arrivals == "bursty" else 1.0}
    if c.prefix or c.turns == "multi":
        d["prefix_groups"] = groups
    return d


def capacity(s: config.Settings, prompt: float, output: float, cached: float) -> float:
    """Requests per second one replica serves at most, from its own step-time model."""
    cost = EngineCore(s).cost
    ctx = prompt + output / 2  # a running request's mean context
    batch = max(1, min(s.max_num_seqs, int(s.kv_cache_tokens // (prompt + output))))
    step = cost.step_seconds(0, 0.0, batch, batch * (ctx + 0.5), int(batch * ctx), batch)
    uncached = max(prompt - cached, 1.0)
    prefill = cost.step_seconds(int(uncached), uncached * uncached / 2, 0, 0.0, 0, 1)
    return 1.0 / (prefill + output * step / batch)


def run_cell(c: Cell, requests: int, pickers: tuple[str, ...]) -> dict[str, Any]:
    s = config.resolve(MODEL, GPU, max_num_seqs=SEQS)
    probe = workload.parse(spec(c, requests, 1.0))  # the same draws at any rate: only the gaps scale
    prompt, output = float(probe.prompt_tokens.mean()), float(probe.output_tokens.mean())
    # what an ideal picker could find cached: the system prompt, and in a conversation its history
    cached = float(c.prefix) if c.turns == "single" else prompt - QUESTION["mean"]
    rate = c.load * c.replicas * capacity(s, prompt, output, cached)
    wl = workload.parse(spec(c, requests, rate))
    rows = {name: fleet.run(s, wl, c.replicas, name).summary for name in pickers}  # type: ignore[arg-type]
    out: dict[str, Any] = {"cell": c.__dict__, "rate": round(rate, 3), "mean_prompt": round(prompt, 1),
                           "ttft_ms": {n: {q: r["ttft_ms"][q] for q in ("p90", "p99")} for n, r in rows.items()}}
    for q in ("p90", "p99"):
        blind = min(rows[n]["ttft_ms"][q] for n in BLIND)
        out[f"ratio_{q}"] = {n: round(r["ttft_ms"][q] / max(blind, 1e-9), 4) for n, r in rows.items()}
    return out


def shade(x: float) -> str:
    """A heatmap character: at or better than the best blind picker is blank, then growing darker."""
    for bound, ch in ((1.0, " "), (1.05, "."), (1.2, ":"), (1.5, "+"), (2.0, "*")):
        if x <= bound:
            return ch
    return "#"


def report(results: list[dict[str, Any]], pickers: tuple[str, ...] = STRATEGIES) -> tuple[list[str], str]:
    """Lines to print and the default picker: the one whose worst cell (max of its p90 and p99 ratios) is best."""
    lines = [f"{'cell':52}" + "".join(f"{n:>14}" for n in pickers) + "   (TTFT p90/p99 / best of random, "
             "round-robin)"]
    for r in results:
        c = Cell(**r["cell"])
        lines.append(f"{c.label:52}" + "".join(f"{r['ratio_p90'][n]:>7.2f}/{r['ratio_p99'][n]:<6.2f}"
                                               for n in pickers))
    lines.append("")
    lines.append("heatmap: worst ratio (p90 or p99) per factor level; ' ' <= 1.00 < '.' <= 1.05 < ':' <= 1.2 < '+' "
                 "<= 1.5 < '*' <= 2 < '#'")
    lines.append(f"{'factor level':22}" + "".join(f"{n:>14}" for n in pickers))
    for name in ("replicas", "load", "prefix", "output", "arrivals", "turns"):
        for level in sorted({r["cell"][name] for r in results}, key=str):
            sub = [r for r in results if r["cell"][name] == level]
            worst = {n: max(max(r["ratio_p90"][n], r["ratio_p99"][n]) for r in sub) for n in pickers}
            lines.append(f"{name + ' ' + str(level):22}" + "".join(f"{shade(worst[n]) * 3:>8}{worst[n]:>6.2f}"
                                                                   for n in pickers))
    worst_cell = {n: max(max(r["ratio_p90"][n], r["ratio_p99"][n]) for r in results) for n in pickers}
    best = min(pickers, key=lambda n: (worst_cell[n], n not in ("prefix", "kv-events")))
    lines.append("")
    lines.append("worst cell per picker (max of p90, p99 ratio): " +
                 ", ".join(f"{n} {worst_cell[n]:.3f}" for n in pickers))
    lines += goals(results)
    lines.append(f"default picker (worst cell best): {best}")
    return lines, best


def goals(results: list[dict[str, Any]]) -> list[str]:
    """Issue 30's goals over the cells run."""
    ll = max(max(r["ratio_p90"]["least-loaded"], r["ratio_p99"]["least-loaded"]) for r in results)
    vs_rr = max(r["ttft_ms"]["least-loaded"][q] / max(r["ttft_ms"]["round-robin"][q], 1e-9)
                for r in results for q in ("p90", "p99"))
    unshared = [r for r in results if not Cell(**r["cell"]).shared]
    out = [f"goal least-loaded never worse than round-robin (p90, p99): worst {vs_rr:.3f}x round-robin "
           f"({ll:.3f}x the best blind picker)"]
    for n in ("prefix", "kv-events"):
        if unshared:
            w = max(max(r["ratio_p90"][n], r["ratio_p99"][n]) for r in unshared)
            out.append(f"goal {n} within 5 % of the best blind picker where nothing is shared ({len(unshared)} "
                       f"cells): worst {w:.3f} {'MET' if w <= 1.05 else 'MISSED'}")
    return out
