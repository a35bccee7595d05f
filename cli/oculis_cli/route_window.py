"""`oculis route analyze --route R --since 7d` (or `--from/--to`): the route's tier table from the
router's counters in Prometheus (route_window_core does the arithmetic). route.py dispatches here
when a window is given; without one, analyze scores a sample (`--sample FILE` or stdin)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from oculis import ConfigError
from oculis_cli import checks_output as out
from oculis_cli import route_window_core
from oculis_cli.cost import resolve_window
from oculis_cli.cost_sources import EXIT_USAGE, SourceError, counters, load_catalog, open_prometheus


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    w = resolve_window(args, "route analyze")
    if w is None:
        return EXIT_USAGE
    t0, t1 = w
    try:
        catalog = load_catalog(args)
        route = catalog.config.route(args.route)
    except SourceError as exc:
        print(f"oculis route analyze: {exc}", file=sys.stderr)
        return exc.code
    except ConfigError as exc:
        print(f"oculis route analyze: --route {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        with open_prometheus(args) as prom:
            c = counters(prom, t0, t1, args.router_selector)
    except SourceError as exc:
        print(f"oculis route analyze: {exc}", file=sys.stderr)
        return exc.code
    rep = route_window_core.table(route, c, catalog.pricing, (t1 - t0).total_seconds())
    rep["window"] = route_window_core.describe_window(t0, t1)
    if out.dump(rep, args.output, stdout):
        return 0
    if args.output == "csv":
        out.write_csv(rep["tiers"], stdout)
        return 0
    render(rep, stdout)
    return 0


def render(rep: dict[str, Any], stdout: TextIO) -> None:
    cols = ["tier", "upstream", "requests", "share", "avg_cost", "cost", "est_monthly"]
    rows: list[list[Any]] = [[t["tier"], t["upstream"], f"{t['requests']:,}", out.pct(t["share"]),
                              out.money(t["avg_cost"]), out.money(t["cost"]), out.money(t["est_monthly"])]
                             for t in rep["tiers"]]
    tot, base, sav, esc = rep["total"], rep["baseline"], rep["saving"], rep["escalation"]
    rows.append(["total", "", f"{tot['requests']:,}", "100.0%" if tot["requests"] else "-", "",
                 out.money(tot["cost"]), out.money(tot["est_monthly"])])
    rows.append([f"all-{base['tier']}", base["upstream"], "", "", "", out.money(base["cost"]),
                 out.money(base["est_monthly"])])
    out.line(f"route {rep['route']}, window {rep['window']}", stdout)
    out.table(None, cols, rows, stdout, right=cols[2:])
    percent = "-" if sav["percent"] is None else f"{sav['percent']:.1f}%"
    out.line(f"saving vs all-{base['tier']}: {out.money(sav['dollars'])} in the window, "
             f"{out.money(sav['est_monthly'])}/month ({percent})", stdout)
    rate = "-" if esc["rate"] is None else f"{100 * esc['rate']:.1f}%"
    reasons = ", ".join(f"{k} {v}" for k, v in esc["by_reason"].items()) or "none"
    out.line(f"escalation rate: {rate} = {esc['escalated']} escalated / {esc['of_requests']} requests the route "
             f"answered ({reasons})", stdout)
    out.line(f"monthly: {rep['monthly_scaling']}; baseline: {base['rule']}", stdout)
