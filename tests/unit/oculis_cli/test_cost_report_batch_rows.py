"""`oculis cost report` shows the Batch API's spend apart from interactive traffic: a table of the router's own
per-line counters (oculis_batch_lines/tokens/cost_dollars_total) by route and the upstream that answered, with
each one's share of that upstream's dollars; text, CSV-free JSON and the pure rows agree."""

from __future__ import annotations

import argparse
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from oculis import parse_config
from oculis_cli import cost
from oculis_cli.clusterinputs import WindowInputs
from oculis_cli.cost_sources import Catalog
from oculis_measure.cost.core import Counters, batch_rows

CONFIG = """oculis:
  upstreams:
    - {name: llama, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m,
       pricing: {input_per_mtok: 1, output_per_mtok: 2}}
  routes:
    - {name: chat, tiers: [{name: only, upstream: llama}]}
"""
COUNTERS = Counters(
    requests={("chat", "only", "llama", "ok"): 300}, prompt_tokens={"llama": 30_000},
    completion_tokens={"llama": 6_000}, cost={"llama": 0.042},
    batch_lines={("chat", "ok"): 198, ("chat", "error"): 1, ("chat", "expired"): 1},
    batch_tokens={("chat", "prompt"): 20_000, ("chat", "completion"): 4_000},
    batch_cost={("chat", "llama"): 0.028})


def report(monkeypatch: pytest.MonkeyPatch, output: str, counters: Counters = COUNTERS) -> str:
    got = WindowInputs(datetime(2026, 12, 2, 3, 0, tzinfo=UTC), datetime(2026, 12, 2, 3, 10, tzinfo=UTC),
                       Catalog(parse_config(CONFIG, "r1.yaml"), source="r1.yaml"), counters, None)
    monkeypatch.setattr(cost, "window_inputs", lambda args, name: got)
    args: Any = argparse.Namespace(group_by="route,tier", gpu=[], output=output, config="r1.yaml")
    out = io.StringIO()
    assert cost.run(args, out) == 0
    return out.getvalue()


def test_batch_spend_is_a_table_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    rep = json.loads(report(monkeypatch, "json"))
    assert rep["batch"] == [{"route": "chat", "upstream": "llama", "lines_ok": 198, "lines_failed": 2,
                             "prompt_tokens": 20_000, "completion_tokens": 4_000, "token_dollars": 0.028,
                             "share_of_upstream_dollars": 0.6667}]
    assert rep["total"]["token_dollars"] == pytest.approx(0.042)  # batch is part of the total, not added to it
    text = report(monkeypatch, "text")
    assert "Batch API (part of the rows above" in text
    line = next(x for x in text.splitlines() if x.startswith("chat") and "66.7%" in x)
    assert "198" in line and "20,000" in line and "$0.028" in line


def test_no_batch_line_in_the_window_no_table(monkeypatch: pytest.MonkeyPatch) -> None:
    quiet = Counters(requests=COUNTERS.requests, cost=COUNTERS.cost, batch_lines={("chat", "ok"): 0.0})
    assert batch_rows(quiet) == []
    assert "Batch API" not in report(monkeypatch, "text", quiet)


def test_lines_without_prices_still_show_as_a_row() -> None:
    rows = batch_rows(Counters(batch_lines={("chat", "ok"): 3}, batch_tokens={("chat", "prompt"): 30}))
    assert rows == [{"route": "chat", "upstream": "-", "lines_ok": 3, "lines_failed": 0, "prompt_tokens": 30,
                     "completion_tokens": 0, "token_dollars": 0.0, "share_of_upstream_dollars": None}]
