"""`oculis sim fleet`'s shell: flags in, `fleet.run` per picker, a side-by-side table or JSON out."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from oculis_measure.figures import pick, reasons_of, text, with_reasons
from oculis_router.picking import STRATEGIES, Strategy
from oculis_sim import config
from oculis_sim.workload import Workload

# Each pick scores every replica and each replica is a whole simulated engine: past this a run takes minutes
# per request batch (QA3 #8: 100,000 replicas printed nothing for minutes). A slice of a larger fleet with
# its share of the traffic gives the same per-replica figures.
MAX_REPLICAS = 1024


def pickers(raw: str) -> list[Strategy]:
    names = [p.strip() for p in raw.split(",") if p.strip()]
    for name in names:
        if name not in STRATEGIES:
            raise config.SimConfigError(f"--picker {name!r}: not a picker; use one of {', '.join(STRATEGIES)} "
                                        "(or a comma-separated list of them)")
    if not names:
        raise config.SimConfigError(f"--picker {raw!r}: empty; use one of {', '.join(STRATEGIES)}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # the same picker twice would print the same row twice, at twice the time
        raise config.SimConfigError(f"--picker {raw!r}: {twice[0]} is named more than once; name each picker once")
    return cast(list[Strategy], names)


def table(rows: list[dict[str, Any]]) -> str:
    """One line per picker: TTFT p50/p90/p99, ITL p50, output tok/s, prefix hit share, load spread."""
    head = (f"{'picker':13}{'TTFT p50':>10}{'p90':>10}{'p99':>10}{'ITL p50':>9}{'E2E p90':>10}{'out tok/s':>11}"
            f"{'prefix hit':>11}{'spread':>8}{'preempt':>9}")
    lines = [head + "   (ms)"]
    for sm in rows:  # a figure of nothing (no request completed) is `-`, its reason below the table
        t = sm["ttft_ms"]
        lines.append(f"{sm['picker']:13}" + "".join(text(pick(t, k), ".1f", 10) for k in ("p50", "p90", "p99"))
                     + text(pick(sm["itl_ms"], "p50"), ".1f", 9) + text(pick(sm["e2e_ms"], "p90"), ".1f", 10)
                     + text(sm["output_tokens_per_s"], ".1f", 11) + text(sm["prefix_hit_share"], ".1%", 11)
                     + text(sm["load_spread"], ".2f", 8) + f"{sm['preemptions']:9d}")
    lines += [f"  -: {why}" for why in reasons_of([{k: v for k, v in sm.items() if k != "per_replica"}
                                                  for sm in rows])]
    return "\n".join(lines)


def run_fleet(args: argparse.Namespace, settings_from: Callable[[argparse.Namespace], config.Settings],
              load_workload: Callable[[Path], Workload]) -> int:
    from oculis_sim import fleet

    names = pickers(args.picker)
    if args.replicas < 1:
        raise config.SimConfigError(f"--replicas {args.replicas}: must be a positive integer")
    if args.replicas > MAX_REPLICAS:
        raise config.SimConfigError(f"--replicas {args.replicas}: at most {MAX_REPLICAS:,} (every pick scores every "
                                    "replica, and each holds a whole engine); simulate a slice of the fleet with its "
                                    "share of the traffic instead")
    if not args.scrape_interval > 0:
        raise config.SimConfigError(f"--scrape-interval {args.scrape_interval}: must be a positive number of seconds")
    if args.lora_adapters < 0:
        raise config.SimConfigError(f"--lora-adapters {args.lora_adapters}: must be 0 (the base model) or more")
    given = (("--lora-skew", args.lora_skew is not None), ("--max-loras", args.max_loras is not None),
             ("--lora-blind", args.lora_blind))
    lora_only = [flag for flag, on in given if on]
    if lora_only and not args.lora_adapters:  # they would change nothing: say so rather than print base-model figures
        raise config.SimConfigError(f"{', '.join(lora_only)}: only apply with LoRA adapters and --lora-adapters is 0; "
                                    "add --lora-adapters N (requests then ask for one of N adapters)")
    max_loras = 1 if args.max_loras is None else args.max_loras
    skew = 0.0 if args.lora_skew is None else args.lora_skew
    if max_loras < 1:
        raise config.SimConfigError(f"--max-loras {max_loras}: must be at least 1 (vLLM's default)")
    if not skew >= 0:
        raise config.SimConfigError(f"--lora-skew {skew:g}: must be 0 (adapters drawn uniformly) or more (1: "
                                    "Zipf-like; 3: the first adapter takes most requests)")
    s = settings_from(args)
    wl = load_workload(args.workload)
    lora = None
    if args.lora_adapters:
        from oculis_sim.fleetlora import draw

        lora = draw(len(wl), args.lora_adapters, skew, args.seed)
    results = [fleet.run(s, wl, args.replicas, name, scrape_interval=args.scrape_interval, seed=args.seed,
                         adapters=lora, max_loras=max_loras, lora_affinity=not args.lora_blind)
               for name in names]
    rows = [r.summary for r in results]
    where = (f"{s.model_name} on {s.gpu.key} x{s.tp}, {args.replicas} replicas of {s.kv_cache_tokens:,} KV tokens, "
             f"max_num_seqs {s.max_num_seqs}")
    if args.output == "json":
        # the figures say what they are wherever they go; a figure of nothing is null, its reason under "absent"
        marked = [with_reasons({"simulated": True, **r, "refused": res.refused})
                  for r, res in zip(rows, results, strict=True)]
        print(json.dumps(marked[0] if len(marked) == 1 else marked, indent=2))
        print(f"oculis sim fleet: simulated figures (oculis-simulator), not measurements; {where}", file=sys.stderr)
    else:
        print(f"SIMULATED (oculis-simulator, not measured): {where}; workload {args.workload} "
              f"({len(wl)} requests)")
        print(table(rows))
        for sm in rows:
            if "lora" in sm:
                lo = sm["lora"]
                print(f"  {sm['picker']}: {args.lora_adapters} LoRA adapters, max_loras {lo['max_loras']}, "
                      f"{'affinity' if lo['affinity'] else 'adapter-blind'}: {lo['adapter_loads']} adapter loads, "
                      f"{lo['slot_waits']} requests waited for a slot")
        refused = results[0].refused
        if refused:
            print(f"  {refused} requests refused: longer than max_model_len")
    return 0
