"""`oculis cost report` shared an `<upstream>/<adapter>` row's tokens and dollars out by call count, so 6 small
`llama/ext` calls beside a `llama/sql` burst showed 1,546 prompt tokens and $0.0028548 while the LoRA adapters
table under it (the router's exact oculis_adapter_*_total) said 40 and $0.000092 (QA Q18). Adapter rows now take
the adapter's own counters, a route tier's `adapter` included (from the config), and the two tables agree."""

from __future__ import annotations

import argparse
import csv
import io
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from oculis import parse_config
from oculis_cli import cost
from oculis_cli.clusterinputs import WindowInputs
from oculis_cli.cost_sources import Catalog
from oculis_measure.cost.core import Counters

CONFIG = """oculis:
  upstreams:
    - {name: llama, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m, adapters: [ext, sql],
       pricing: {input_per_mtok: 2, output_per_mtok: 0.6}}
  routes:
    - name: chat
      tiers:
        - {name: sql-tier, upstream: llama, adapter: sql}
"""
COUNTERS = Counters(
    requests={("llama/ext", "direct", "llama", "ok"): 6, ("llama/sql", "direct", "llama", "ok"): 200,
              ("chat", "sql-tier", "llama", "ok"): 100, ("llama", "direct", "llama", "ok"): 20},
    prompt_tokens={"llama": 52_040}, completion_tokens={"llama": 10_020}, cost={"llama": 0.110092},
    adapter_prompt_tokens={("llama", "ext"): 40, ("llama", "sql"): 45_000},
    adapter_completion_tokens={("llama", "ext"): 20, ("llama", "sql"): 9_000},
    adapter_cost={("llama", "ext"): 0.000092, ("llama", "sql"): 0.0954})


def report(monkeypatch: pytest.MonkeyPatch, output: str) -> str:
    got = WindowInputs(datetime(2026, 12, 2, 3, 0, tzinfo=UTC), datetime(2026, 12, 2, 3, 10, tzinfo=UTC),
                       Catalog(parse_config(CONFIG, "r1.yaml"), source="r1.yaml"), COUNTERS, None)
    monkeypatch.setattr(cost, "window_inputs", lambda args, name: got)
    args: Any = argparse.Namespace(group_by="route,tier", gpu=[], output=output, config="r1.yaml")
    out = io.StringIO()
    assert cost.run(args, out) == 0
    return out.getvalue()


def test_cost_report_adapter_rows_agree_with_the_adapters_table(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = {(r["route"], r["tier"]): r for r in csv.DictReader(io.StringIO(report(monkeypatch, "csv")))}
    assert (rows[("llama/ext", "direct")]["prompt_tokens"], rows[("llama/ext", "direct")]["token_dollars"]) == (
        "40", "9.2e-05")  # was 52,040 x 6/326 = 958 and $0.0020262
    rep = json.loads(report(monkeypatch, "json"))
    by = {(r["route"], r["tier"]): r for r in rep["rows"]}
    table = {a["adapter"]: a for a in rep["adapters"]}
    assert by[("llama/ext", "direct")]["completion_tokens"] == table["ext"]["completion_tokens"] == 20
    # sql: the direct burst (200 calls) and route chat's sql tier (100) share the adapter's 45,000 tokens, $0.0954
    assert by[("llama/sql", "direct")]["prompt_tokens"] == 30_000
    assert by[("chat", "sql-tier")]["prompt_tokens"] == 15_000
    assert by[("llama/sql", "direct")]["token_dollars"] + by[("chat", "sql-tier")]["token_dollars"] == pytest.approx(
        table["sql"]["token_dollars"])
    # the base model's 20 calls take the rest: 52,040 - 40 - 45,000 tokens, $0.110092 - 0.000092 - 0.0954
    assert by[("llama", "direct")]["prompt_tokens"] == 7_000
    assert by[("llama", "direct")]["token_dollars"] == pytest.approx(0.0146)
    assert rep["total"]["token_dollars"] == pytest.approx(0.110092) and rep["total"]["unattributed_dollars"] == 0
    text = report(monkeypatch, "table")
    assert "LoRA adapters" in text and "counted per call" in text
