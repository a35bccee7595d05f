"""`oculis cost report --since 7d --group-by route,tier[,upstream]`: dollars by route, tier and upstream
from the router's counters in Prometheus and the upstreams' prices (oculis_measure.cost.core does the arithmetic)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from oculis_cli import checks_output as out
from oculis_cli.clusterinputs import emit, window_inputs
from oculis_cli.cost_sources import EXIT_USAGE, add_source_flags
from oculis_measure.cost import core as cost_core
from oculis_measure.route import window as route_window_core


def add_window_flags(p: Any) -> None:
    p.add_argument("--since", help="window ending now, as a Prometheus duration: 7d, 24h, 1h30m")
    p.add_argument("--from", dest="start", metavar="RFC3339", help="window start, e.g. 2026-11-24T00:00:00Z")
    p.add_argument("--to", dest="end", metavar="RFC3339", help="window end (default now)")
    p.add_argument("--router-selector", default="", metavar="LABELS",
                   help='PromQL label matchers selecting the routers\' series, e.g. job="oculis"')


def register(sub: Any) -> None:
    cost = sub.add_parser("cost", help="what the routes cost: `oculis cost report`")
    cost_sub = cost.add_subparsers(dest="cost_command", required=True, metavar="COMMAND")
    p = cost_sub.add_parser("report", help="cost by route, tier and upstream over a window (estimates)")
    add_window_flags(p)
    p.add_argument("--group-by", default="route,tier", help="comma-separated: route, tier, upstream "
                   "(default route,tier)")
    p.add_argument("--gpu", action="append", default=[], metavar="UPSTREAM=DOLLARS[xGPUS]",
                   help="a self-hosted upstream's price per GPU-hour and its GPUs (default 1), e.g. llama-8b=2.50x2; "
                   "overrides the GPUUpstream's pricing.gpuHourDollars (repeatable)")
    add_source_flags(p)
    out.add_output_flag(p)
    p.set_defaults(run=run)


def parse_gpu(raw: str) -> tuple[str, cost_core.GPUCost]:
    """`llama-8b=2.50x2` -> ("llama-8b", GPUCost(2.5, 2)); ValueError naming the fix."""
    name, sep, rest = raw.partition("=")
    dollars, _, gpus = rest.partition("x")
    try:
        value, count = float(dollars), int(gpus or "1")
    except ValueError:
        value, count = -1.0, 0
    if not sep or not name or not (value >= 0 and value < float("inf")) or count < 1:
        raise ValueError(f"{raw!r}: write UPSTREAM=DOLLARS_PER_GPU_HOUR[xGPUS], e.g. llama-8b=2.50x2")
    return name, cost_core.GPUCost(value, count)


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    try:
        group_by = cost_core.parse_group_by(args.group_by)
    except ValueError as exc:
        print(f"oculis cost report: --group-by {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        gpu_flags = dict(parse_gpu(g) for g in args.gpu)
    except ValueError as exc:
        print(f"oculis cost report: --gpu {exc}", file=sys.stderr)
        return EXIT_USAGE
    got = window_inputs(args, "cost report")
    if isinstance(got, int):
        return got
    known = [u.name for u in got.catalog.config.upstreams]
    for name, price in gpu_flags.items():  # a typo would otherwise bill a made-up upstream as an (idle) row
        # (with --config only: a cluster's rendered config leaves out GPUUpstreams no route names yet)
        if getattr(args, "config", None) is not None and name not in known:
            print(f"oculis cost report: --gpu '{name}={price.dollars_per_gpu_hour:g}x{price.gpus}': no upstream "
                  f"{name!r} in {got.catalog.source}; name one of {', '.join(known) or '(none)'}", file=sys.stderr)
            return EXIT_USAGE
    hours = (got.t1 - got.t0).total_seconds() / 3600
    gpu = got.catalog.gpu | gpu_flags
    cells = cost_core.cells(got.counters, got.catalog.pricing, gpu, hours,
                            cost_core.tier_adapters(got.catalog.config.routes))
    rep = cost_core.report(cells, group_by, cost_core.unattributed_dollars(got.counters, cells),
                           route_window_core.describe_window(got.t0, got.t1), bool(gpu))
    rep["prices_from"] = got.catalog.source
    rep["adapters"] = cost_core.adapter_rows(got.counters)  # LoRA adapters: their own counters, exact
    rep["batch"] = cost_core.batch_rows(got.counters)  # Batch API spend apart (oculis_batch_*_total), exact
    emit(rep, args.output, stdout, "rows", render)
    return 0


def render(rep: dict[str, Any], stdout: TextIO) -> None:
    keys = rep["group_by"]
    cols = [*keys, "requests", "answered", "calls", "cache hits", "prompt tok", "output tok", "cached tok", "token $",
            "$/1k req", "cache saving $", "GPU $"]
    rows = [[*(r[k] for k in keys), f"{r['requests']:,}", f"{r['answered']:,}", f"{r['calls']:,}",
             f"{r['cache_hits']:,}", f"{r['prompt_tokens']:,}",
             f"{r['completion_tokens']:,}", f"{r['cached_tokens']:,}", out.money(r["token_dollars"]),
             out.money(r["dollars_per_1k_requests"]), out.money(r["cache_saving_dollars"]),
             out.money(r["gpu_dollars"])] for r in rep["rows"]]
    t = rep["total"]
    rows.append(["total", *([""] * (len(keys) - 1)), f"{t['requests']:,}", f"{t['answered']:,}", f"{t['calls']:,}",
                 f"{t['cache_hits']:,}",
                 f"{t['prompt_tokens']:,}", f"{t['completion_tokens']:,}", f"{t['cached_tokens']:,}",
                 out.money(t["token_dollars"]), "", out.money(t["cache_saving_dollars"]), out.money(t["gpu_dollars"])])
    out.line(f"cost report, window {rep['window']}, prices from {rep['prices_from']}", stdout)
    out.table(None, cols, rows, stdout, right=cols[len(keys):])
    if t["unattributed_dollars"]:
        out.line(f"unattributed (no request counted for the upstream in the window): "
                 f"{out.money(t['unattributed_dollars'])}", stdout)
    if rep.get("adapters"):
        acols = ["upstream", "adapter", "prompt tok", "output tok", "token $", "share of upstream $"]
        arows = [[a["upstream"], a["adapter"], f"{a['prompt_tokens']:,}", f"{a['completion_tokens']:,}",
                  out.money(a["token_dollars"]),
                  "" if a["share_of_upstream_dollars"] is None else f"{a['share_of_upstream_dollars']:.1%}"]
                 for a in rep["adapters"]]
        out.table("LoRA adapters (counted per call: oculis_adapter_*_total)", acols, arows, stdout, right=acols[2:])
    if rep.get("batch"):
        bcols = ["route", "upstream", "lines ok", "lines failed", "prompt tok", "output tok", "token $",
                 "share of upstream $"]
        brows = [[b["route"], b["upstream"], *("" if b[k] is None else f"{b[k]:,}" for k in (
                  "lines_ok", "lines_failed", "prompt_tokens", "completion_tokens")), out.money(b["token_dollars"]),
                  "" if b["share_of_upstream_dollars"] is None else f"{b['share_of_upstream_dollars']:.1%}"]
                 for b in rep["batch"]]
        out.table("Batch API (part of the rows above, counted per line: oculis_batch_*_total)", bcols, brows,
                  stdout, right=bcols[2:])
    out.line("requests: taken by the row's tier, any outcome (errors and broken streams too); answered: those it "
             "answered (ok or a cache hit), what $/1k req divides by; calls: billed calls (answers given, answers a "
             "later tier replaced, a verifier's gradings): token $ (but a LoRA adapter's, counted per call), cache "
             "saving and GPU $ are shared out by them", stdout)
    for k, v in rep["basis"].items():
        out.line(f"{k}: {v}", stdout)
    out.line(f"note: {rep['note']}", stdout)
