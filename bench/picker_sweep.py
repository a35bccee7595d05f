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
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from oculis_router.picking import STRATEGIES
from oculis_sim import config, fleet, workload
from oculis_sim.engine import EngineCore
from oculis_sim.replay import stats_ms

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


def parse_cell(text: str) -> Cell:
    """`REPLICAS,LOAD,PREFIX,OUTPUT,ARRIVALS,TURNS` (e.g. `4,0.6,128,50,bursty,multi`) as a Cell; a clear
    one-line error otherwise. Any values are accepted, not only the grid's levels (an unseen shape)."""
    parts = text.split(",")
    try:
        if len(parts) != 6 or parts[4] not in ARRIVALS or parts[5] not in TURNS:
            raise ValueError
        cell = Cell(int(parts[0]), float(parts[1]), int(parts[2]), int(parts[3]), parts[4], parts[5])
    except ValueError:
        raise SystemExit(f"--cell {text!r}: expected REPLICAS,LOAD,PREFIX,OUTPUT,ARRIVALS,TURNS with ARRIVALS one "
                         f"of {'/'.join(ARRIVALS)} and TURNS one of {'/'.join(TURNS)}, e.g. 4,0.6,128,50,bursty,multi"
                         ) from None
    if cell.replicas < 1 or not cell.load > 0 or cell.prefix < 0 or cell.output < 1:
        raise SystemExit(f"--cell {text!r}: replicas >= 1, load > 0, prefix >= 0 and output >= 1, e.g. "
                         "4,0.6,128,50,bursty,multi")
    return cell


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


def run_cell(c: Cell, requests: int, pickers: tuple[str, ...], seeds: tuple[int, ...] = (1,)) -> dict[str, Any]:
    """Every picker on the cell's arrivals, once per workload seed. `ttft_ms` and `ratio_*` pool the seeds'
    requests (one distribution of len(seeds) x `requests`); `seed_ttft_ms` keeps each seed's own figures,
    from which `spread` and the goal's interval are computed (the seeds' spread is the tail's noise)."""
    s = config.resolve(MODEL, GPU, max_num_seqs=SEQS)
    probe = workload.parse(spec(c, requests, 1.0))  # the same draws at any rate: only the gaps scale
    prompt, output = float(probe.prompt_tokens.mean()), float(probe.output_tokens.mean())
    # what an ideal picker could find cached: the system prompt, and in a conversation its history
    cached = float(c.prefix) if c.turns == "single" else prompt - QUESTION["mean"]
    rate = c.load * c.replicas * capacity(s, prompt, output, cached)
    samples: dict[str, list[np.ndarray]] = {n: [] for n in pickers}
    per_seed: dict[str, dict[str, list[float]]] = {n: {"p90": [], "p99": []} for n in pickers}
    for seed in seeds:
        wl = workload.parse({**spec(c, requests, rate), "seed": seed})
        for name in pickers:
            res = fleet.run(s, wl, c.replicas, name)  # type: ignore[arg-type]
            assert res.ttft_s is not None
            samples[name].append(res.ttft_s[~np.isnan(res.ttft_s)])
            for q in ("p90", "p99"):
                per_seed[name][q].append(res.summary["ttft_ms"][q])
    pooled = {n: stats_ms(np.concatenate(samples[n])) for n in pickers}
    out: dict[str, Any] = {"cell": c.__dict__, "rate": round(rate, 3), "mean_prompt": round(prompt, 1),
                           "seeds": list(seeds),
                           "ttft_ms": {n: {q: pooled[n][q] for q in ("p90", "p99")} for n in pickers},  # type: ignore[index]
                           "seed_ttft_ms": per_seed}
    for q in ("p90", "p99"):
        blind = min(out["ttft_ms"][n][q] for n in BLIND)
        out[f"ratio_{q}"] = {n: round(out["ttft_ms"][n][q] / max(blind, 1e-9), 4) for n in pickers}
        # each seed's ratio to that seed's best blind picker: the range a single run can land in
        seed_blind = [min(per_seed[n][q][k] for n in BLIND) for k in range(len(seeds))]
        out[f"spread_{q}"] = {n: [round(min(v), 4), round(max(v), 4)] for n in pickers
                              for v in [[x / max(b, 1e-9) for x, b in zip(per_seed[n][q], seed_blind, strict=True)]]}
    return out


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """The geometric mean of per-seed ratios and its 95 % t-interval (seeds are independent runs of the same
    cell; within one run the requests are not independent: a burst's tail moves together). One seed: no
    interval (the bounds are the ratio itself)."""
    logs = np.log(np.asarray(ratios, dtype=float))
    m = float(logs.mean())
    if len(logs) < 2:
        return math.exp(m), math.exp(m), math.exp(m)
    half = float(stats.t.ppf(0.975, len(logs) - 1)) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
    return math.exp(m), math.exp(m - half), math.exp(m + half)


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
    """Issue 30's goals over the cells run. least-loaded against round-robin is judged per cell on the
    seeds' ratios: the pooled ratio, and a 95 % interval of the per-seed ratios; a cell is worse beyond noise
    only where that whole interval lies above 1 (with one seed there is no interval, only the figure)."""
    ll = max(max(r["ratio_p90"]["least-loaded"], r["ratio_p99"]["least-loaded"]) for r in results)
    rows = []
    for r in results:
        for q in ("p90", "p99"):
            pooled = r["ttft_ms"]["least-loaded"][q] / max(r["ttft_ms"]["round-robin"][q], 1e-9)
            seeds = r.get("seed_ttft_ms")
            per = ([a / max(b, 1e-9) for a, b in zip(seeds["least-loaded"][q], seeds["round-robin"][q], strict=True)]
                   if seeds else [pooled])
            rows.append((pooled, q, r, per, interval(per)))
    pooled, q, worst, per, (_, lo, hi) = max(rows, key=lambda x: x[0])
    k = len(per)
    beyond = [x for x in rows if x[4][1] > 1.0]
    out = [f"goal least-loaded never worse than round-robin (p90, p99): worst {pooled:.3f}x round-robin pooled over "
           f"{k} seed{'s' if k > 1 else ''} ({ll:.3f}x the best blind picker), at {q} in "
           f"{Cell(**worst['cell']).label.strip()}"]
    if k > 1:
        out.append(f"  that cell's per-seed ratios {min(per):.2f}..{max(per):.2f}, 95 % interval {lo:.2f}..{hi:.2f}; "
                   f"cells (x p90, p99) worse beyond the seeds' noise (interval wholly above 1): {len(beyond)} of "
                   f"{len(rows)}: {'MISSED' if beyond else 'none shown worse'} (~2.5 % of tests would be flagged by "
                   f"chance if the two pickers were equal; with few seeds an interval is wide and shows little)")
        for pooled_b, qb, rb, perb, (_, lob, hib) in beyond:
            out.append(f"    {Cell(**rb['cell']).label.strip()} {qb}: pooled {pooled_b:.3f}, seeds "
                       f"{', '.join(f'{x:.2f}' for x in perb)}, interval {lob:.2f}..{hib:.2f}")
    else:
        out.append("  one seed: a single run's tail, no interval (run --seeds 3 or more for a verdict)")
    unshared = [r for r in results if not Cell(**r["cell"]).shared]
    for n in ("prefix", "kv-events"):
        if unshared:
            w = max(max(r["ratio_p90"][n], r["ratio_p99"][n]) for r in unshared)
            out.append(f"goal {n} within 5 % of the best blind picker where nothing is shared ({len(unshared)} "
                       f"cells): worst {w:.3f} {'MET' if w <= 1.05 else 'MISSED'}")
    return out
