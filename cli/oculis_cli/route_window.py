"""`oculis route analyze --route R --since 7d` (or `--from/--to`): the route's tier table from the
router's counters in Prometheus (oculis_measure.route.window does the arithmetic). route.py dispatches here
when a window is given; without one, analyze scores a sample (`--sample FILE` or stdin)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from oculis_cli import checks_output as out
from oculis_cli.clusterinputs import emit, window_inputs
from oculis_measure.cost import core as cost_core
from oculis_measure.route import cascade
from oculis_measure.route import window as route_window_core


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    got = window_inputs(args, "route analyze", route=True)
    if isinstance(got, int):
        return got
    assert got.route is not None
    adapters = cost_core.tier_adapters(got.catalog.config.routes)  # every route's: they share the upstreams
    rep = route_window_core.table(got.route, got.counters, got.catalog.pricing, (got.t1 - got.t0).total_seconds(),
                                  adapters)
    rep["window"] = route_window_core.describe_window(got.t0, got.t1)
    rate = None if args.answer_escalation_rate is None else cascade.parse_rate(args.answer_escalation_rate)
    upstreams = {u.name: u for u in got.catalog.config.upstreams}
    rep["cascade"] = route_window_core.window_cascade(got.route, upstreams, got.counters, rate, adapters)
    emit(rep, args.output, stdout, "tiers", render)
    return 0


def render(rep: dict[str, Any], stdout: TextIO) -> None:
    routed = any("routed" in t for t in rep["tiers"])
    cols = ["tier", "upstream", *(["routed", "routed share", "replaced"] if routed else []), "requests", "share",
            "avg_cost", "cost", "est_monthly"]

    def cells(t: dict[str, Any]) -> list[Any]:
        if not routed:
            return []
        if "gradings" in t:
            return ["", "", f"{t['gradings']:,} gradings"]
        return [f"{t.get('routed', 0):,}", out.pct(t.get("routed_share")), f"{t.get('replaced_answers', 0):,}"]

    rows: list[list[Any]] = [[t["tier"], t["upstream"], *cells(t), f"{t['requests']:,}", out.pct(t["share"]),
                              out.money(t["avg_cost"]), out.money(t["cost"]), out.money(t["est_monthly"])]
                             for t in rep["tiers"]]
    pad = ["", "", ""] if routed else []
    tot, base, sav, esc = rep["total"], rep["baseline"], rep["saving"], rep["escalation"]
    rows.append(["total", "", *pad, f"{tot['requests']:,}", "100.0%" if tot["requests"] else "-", "",
                 out.money(tot["cost"]), out.money(tot["est_monthly"])])
    rows.append([f"all-{base['tier']}", base["upstream"], *pad, "", "", "", out.money(base["cost"]),
                 out.money(base["est_monthly"])])
    out.line(f"route {rep['route']}, window {rep['window']}", stdout)
    out.table(None, cols, rows, stdout, right=cols[2:])
    percent = "-" if sav["percent"] is None else f"{sav['percent']:.1f}%"
    out.line(f"saving vs all-{base['tier']}: {out.money(sav['dollars'])} in the window, "
             f"{out.money(sav['est_monthly'])}/month ({percent})", stdout)
    rate = "-" if esc["rate"] is None else f"{100 * esc['rate']:.1f}%"
    reasons = ", ".join(f"{k} {v}" for k, v in esc["by_reason"].items()) or "none"
    out.line(f"escalation rate: {rate} = {esc['escalated']} escalated / {esc['of_requests']} requests the route "
             f"took, any outcome ({tot['answered']:,} answered) ({reasons})", stdout)
    out.line(f"monthly: {rep['monthly_scaling']}; baseline: {base['rule']}", stdout)
    out.line(f"attribution: {rep['attribution']}", stdout)
    if "cascade" in rep:
        stdout.write(out.cascade_text(rep["cascade"]))
