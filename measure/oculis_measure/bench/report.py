"""`oculis bench run --report out.html`: one self-contained page (plotly's JavaScript inlined once, no
network needed to open it): the verdict, the comparison table the CLI prints, latency CDFs on log axes
(a 30 ms baseline and a 20 s current both stay visible), output throughput over time, and the changes
beyond their limits as horizontal bars clipped at +/-100 % with the real value written on each; the raw
JSON is folded away at the end."""

from __future__ import annotations

import html as _html
import json
from typing import Any

import numpy as np

from oculis_measure.bench.stats import table_cells

CLIP_PCT = 100.0  # delta bars beyond this are drawn at it; the label carries the real change


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    xs = np.sort(np.asarray(values, dtype=float))
    return xs.tolist(), (np.arange(1, len(xs) + 1) / max(len(xs), 1)).tolist()


def _throughput(samples: dict[str, list[float]], bin_s: float = 1.0) -> tuple[list[float], list[float]]:
    done, tokens = samples.get("done_s") or [], samples.get("output_tokens") or []
    if not done:
        return [], []
    edges = np.arange(np.floor(min(done)), np.ceil(max(done)) + bin_s, bin_s)
    sums, _ = np.histogram(done, bins=edges, weights=tokens)
    return edges[:-1].tolist(), (sums / bin_s).tolist()


def _table(doc: dict[str, Any]) -> str:
    """The CLI's comparison table as HTML."""
    cols, rows = table_cells(doc)
    body = [("<tr style='color:#d62728;font-weight:bold'>" if cells[-1] == "regressed" else "<tr>")
            + "".join(f"<td>{_html.escape(x)}</td>" for x in cells) + "</tr>" for cells in rows]
    return ("<table border='1' cellpadding='4' style='border-collapse:collapse;font-family:monospace'><tr>"
            + "".join(f"<th>{h or 'status'}</th>" for h in cols) + "</tr>" + "".join(body) + "</table>")


def _facts(doc: dict[str, Any]) -> str:
    wl, cur = doc["workload"], doc["current"]
    req, win = cur["requests"], cur.get("window") or {}
    items = [("verdict", f"{doc['verdict'] or 'none'}" + (f": {doc['reasons'][0]}" if doc["reasons"] else "")),
             *[("also", r) for r in doc["reasons"][1:]],
             ("workload", f"route {wl['route']}, profile {wl['profile']}, seed {wl['seed']}, load {wl['load']}, "
                          f"fingerprint {doc['workload_hash']}"),
             ("prompts", "salted for this run (nothing reused from an earlier run's prefix cache)"
              if doc.get("fresh_cache") else "not salted (may hit prefixes an earlier run cached)"),
             ("window", f"{win.get('window_s', cur['duration_s']):,.1f} s (every rate divides by it)"),
             ("requests", f"{req['succeeded']} succeeded, {req['failed']} failed, {req['cancelled']} cut at the "
                          f"drain, {req['warmup_excluded']} warm-up excluded"),
             *[("warning", w) for w in doc.get("warnings", [])]]
    return "<ul>" + "".join(f"<li><b>{k}</b>: {_html.escape(str(v))}</li>" for k, v in items) + "</ul>"


def html(doc: dict[str, Any], current: dict[str, list[float]], baseline: dict[str, list[float]] | None) -> str:
    import plotly.graph_objects as go  # type: ignore[import-untyped]  # plotly ships no type hints
    from plotly.subplots import make_subplots  # type: ignore[import-untyped]

    runs = [("current", current, "#2ca02c")] + ([("baseline", baseline, "#7f7f7f")] if baseline else [])
    deltas = {k: d for k, d in (doc.get("delta") or {}).items() if d.get("change_pct") is not None}
    fig = make_subplots(rows=2, cols=2, subplot_titles=(
        "TTFT CDF (ms, log axis)", "E2E latency CDF (ms, log axis)", "output tokens/s over time (1 s bins)",
        f"change vs baseline (%, bars clipped at +/-{CLIP_PCT:g})" if deltas else "change vs baseline: no baseline"))
    for name, s, color in runs:
        for col, key in ((1, "ttft_ms"), (2, "e2e_ms")):
            x, y = _cdf([v for v in s.get(key) or [] if v > 0])  # a log axis has no 0
            fig.add_trace(go.Scatter(x=x, y=y, name=f"{name} {key}", line={"color": color}), row=1, col=col)
        x, y = _throughput(s)
        fig.add_trace(go.Scatter(x=x, y=y, name=f"{name} tok/s", line={"color": color}), row=2, col=1)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="ms", row=1, col=col)
        fig.update_yaxes(title_text="share of requests", range=[0, 1], row=1, col=col)
    fig.update_xaxes(title_text="seconds from the run's start (by completion)", row=2, col=1)
    fig.update_yaxes(title_text="output tokens/s", row=2, col=1)
    if deltas:
        keys = list(deltas)[::-1]  # top to bottom as in the table
        pct = [float(deltas[k]["change_pct"]) for k in keys]
        fig.add_trace(go.Bar(y=keys, x=[max(-CLIP_PCT, min(CLIP_PCT, p)) for p in pct], orientation="h",
                             text=[f"{p:+.1f}%" for p in pct], textposition="auto", name="change %",
                             marker_color=["#d62728" if deltas[k]["status"] == "regressed" else
                                           "#2ca02c" if deltas[k]["status"] == "improved" else "#7f7f7f"
                                           for k in keys]), row=2, col=2)
        fig.update_xaxes(title_text="change % (red: regressed, green: improved, grey: within limits)",
                         range=[-CLIP_PCT * 1.05, CLIP_PCT * 1.05], row=2, col=2)
    fig.update_layout(height=900, title_text=f"oculis bench run: {doc['verdict'] or 'no verdict'}"
                      + (" (SIMULATED)" if doc["simulated"] else ""))
    plot = fig.to_html(full_html=False, include_plotlyjs="inline")
    sim = f"<p><b>{_html.escape(doc['note'])}</b></p>" if doc["simulated"] and doc.get("note") else ""
    raw = _html.escape(json.dumps({k: doc.get(k) for k in ("current", "baseline", "delta", "slos")}, indent=2))
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>oculis bench run</title></head><body>"
            f"<h1>oculis bench run: {_html.escape(str(doc['verdict'] or 'no verdict'))}</h1>{sim}{_facts(doc)}"
            f"<h2>Metrics</h2>{_table(doc)}{plot}"
            f"<details><summary>raw JSON (current, baseline, delta, SLOs)</summary><pre>{raw}</pre></details>"
            "</body></html>\n")
