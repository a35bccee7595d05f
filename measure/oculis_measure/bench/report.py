"""`oculis bench run --report out.html`: one self-contained page (plotly's JavaScript inlined once, no
network needed to open it): latency CDFs, output throughput over time, and baseline vs current."""

from __future__ import annotations

import html as _html
import json
from typing import Any

import numpy as np


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


def html(doc: dict[str, Any], current: dict[str, list[float]], baseline: dict[str, list[float]] | None) -> str:
    import plotly.graph_objects as go  # type: ignore[import-untyped]  # plotly ships no type hints
    from plotly.subplots import make_subplots  # type: ignore[import-untyped]

    runs = [("current", current, "#2ca02c")] + ([("baseline", baseline, "#7f7f7f")] if baseline else [])
    fig = make_subplots(rows=2, cols=2, subplot_titles=("TTFT CDF (ms)", "E2E latency CDF (ms)",
                                                        "output tokens/s over time (by completion, 1 s bins)",
                                                        "baseline vs current"))
    for name, s, color in runs:
        for col, key in ((1, "ttft_ms"), (2, "e2e_ms")):
            x, y = _cdf(s.get(key) or [])
            fig.add_trace(go.Scatter(x=x, y=y, name=f"{name} {key}", line={"color": color}), row=1, col=col)
        x, y = _throughput(s)
        fig.add_trace(go.Scatter(x=x, y=y, name=f"{name} tok/s", line={"color": color}), row=2, col=1)
    deltas = doc.get("delta") or {}
    if deltas:
        keys = list(deltas)
        fig.add_trace(go.Bar(x=keys, y=[deltas[k]["change_pct"] or 0 for k in keys], name="change %",
                             marker_color=["#d62728" if deltas[k]["status"] == "regressed" else "#1f77b4"
                                           for k in keys]), row=2, col=2)
    fig.update_layout(height=800, title_text=f"oculis bench run: {doc['verdict'] or 'no verdict'}"
                      + (" (SIMULATED)" if doc["simulated"] else ""))
    plot = fig.to_html(full_html=False, include_plotlyjs="inline")
    summary = {k: doc[k] for k in ("verdict", "reasons", "simulated", "note", "workload", "workload_hash",
                                   "warnings")}
    sim = f"<p><b>{_html.escape(doc['note'])}</b></p>" if doc["simulated"] and doc.get("note") else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>oculis bench run</title></head><body>"
            f"<h1>oculis bench run: {_html.escape(str(doc['verdict'] or 'no verdict'))}</h1>{sim}{plot}"
            f"<h2>Summary</h2><pre>{_html.escape(json.dumps(summary, indent=2))}</pre>"
            f"<h2>Current</h2><pre>{_html.escape(json.dumps(doc['current'], indent=2))}</pre>"
            f"<h2>Delta</h2><pre>{_html.escape(json.dumps(doc.get('delta'), indent=2))}</pre></body></html>\n")
