"""Output for the measurement commands (status --check-deps, route analyze --since, eval run, cost
report, cache advise): `-o table` is a Rich table (plain text when piped or NO_COLOR), `json` and
`yaml` the report's dict, `csv` its rows."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from oculis_measure.figures import Absent, cell, with_reasons

FORMATS = ("table", "json", "yaml")
FORMATS_CSV = ("table", "json", "yaml", "csv")


def add_output_flag(p: Any, with_csv: bool = True) -> None:
    p.add_argument("-o", "--output", choices=FORMATS_CSV if with_csv else FORMATS, default="table",
                   help="table (default), json, yaml" + (" or csv" if with_csv else ""))


def dump(report: dict[str, Any], fmt: str, out: TextIO) -> bool:
    """Write json/yaml; False for the formats the command renders itself. A figure that cannot exist
    (figures.Absent) is null, its reason under "absent"."""
    if fmt == "json":
        out.write(json.dumps(with_reasons(report), indent=2) + "\n")
        return True
    if fmt == "yaml":
        out.write(yaml.safe_dump(with_reasons(report), sort_keys=False, allow_unicode=True))
        return True
    return False


def write_csv(rows: Sequence[dict[str, Any]], out: TextIO) -> None:
    if not rows:
        return
    cols = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None or isinstance(r.get(k), Absent) else r.get(k)) for k in cols})
    out.write(buf.getvalue())


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO,
          right: Sequence[str] = ()) -> None:
    """A Rich table, printed to `out` (colour only on a terminal; Rich honours NO_COLOR). Without Rich
    (the router and operator images install only their extra, and `oculis status --check-deps` must
    run there) the same table in plain aligned columns."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        plain_table(title, columns, rows, out, right)
        return

    t = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", overflow="fold")
    for r in rows:
        t.add_row(*(cell(v) for v in r))
    Console(file=out, width=160, soft_wrap=True).print(t)


def plain_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO,
                right: Sequence[str] = ()) -> None:
    cells = [list(columns), *[[cell(v) for v in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    if title:
        out.write(title + "\n")
    for row in cells:
        out.write("  ".join(v.rjust(w) if c in right else v.ljust(w)
                            for v, w, c in zip(row, widths, columns, strict=True)).rstrip() + "\n")


def line(text: str, out: TextIO) -> None:
    out.write(text + "\n")


def money(v: float | Absent | None) -> str:
    if v is None or isinstance(v, Absent):
        return "-"
    if abs(v) < 5e-7:  # below the last digit shown: never "$-0.000000" (QA3 Part 2 #7)
        v = 0.0
    if abs(v) >= 100:
        return f"${v:,.2f}"
    return f"${v:,.4f}" if abs(v) >= 0.01 else f"${v:.6f}"


def pct(v: float | Absent | None) -> str:
    return "-" if v is None or isinstance(v, Absent) else f"{100 * v:.1f}%"


def cascade_text(rep: dict[str, Any]) -> str:
    """The cascade block of a table report."""
    buf = io.StringIO()
    cols = ["tier", "upstream", "routed", "p_esc", "final", "routed-only $", "cascade $"]
    rows: list[list[Any]] = [[t["tier"], t["upstream"] + ("" if t["priced"] else " (unpriced)"),
                              pct(t["routed_share"]), pct(t["p_esc"]), pct(t["final_share"]),
                              money(t["routed_only_cost"]), money(t["cascade_cost"])] for t in rep["tiers"]]
    tot, base = rep["total"], rep["all_strongest"]
    over = "" if tot["cascade_overhead_pct"] is None else f" ({tot['cascade_overhead_pct']:+.1f}%)"
    rows.append(["total", "", "100.0%" if tot["requests"] else "-", "", "", money(tot["routed_only_cost"]),
                 money(tot["cascade_cost"]) + over])
    rows.append([f"all-{base['tier']}", base["upstream"], "", "", "", money(base["cost"]), ""])
    buf.write("cascade (escalation on the answer) vs routed-only:\n")
    plain_table(None, cols, rows, buf, right=cols[2:])

    def pc(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}%"

    buf.write(f"saving vs all-{base['tier']}: routed-only {pc(base['routed_only_saving_pct'])}, "
              f"cascade {pc(base['cascade_saving_pct'])}\n")
    buf.write(f"p_esc: {rep['p_esc_source']}\n")
    if rep.get("observed"):
        obs = rep["observed"]
        buf.write(f"observed: {money(obs['dollars'])} ({money(obs['per_request'])} per request): {obs['what']}\n")
    for name, why in rep.get("unchecked", {}).items():
        buf.write(f"  {name}: p_esc 0, {why}\n")
    verifier = rep["verifier"]
    buf.write(f"verifier: {verifier.get('why', verifier)}\n")
    buf.write(f"tokens: {rep['tokens']}\n")
    buf.write(f"formula: {rep['formula']}\n")
    if tot.get("cascade_cost_at_mean_p_esc") is not None:
        buf.write(f"expected value at the p_esc column (the formula applied to the averages): "
                  f"{money(tot['cascade_cost_at_mean_p_esc'])} in total; "
                  + ", ".join(f"{t['tier']} {money(t['cascade_cost_at_mean_p_esc'])}" for t in rep["tiers"]) + "\n")
    if rep.get("unpriced_note"):
        buf.write(f"unpriced: {rep['unpriced_note']}\n")
    return buf.getvalue()
