"""`oculis cost report --gpu nope=2.5` (a typo in the upstream's name) was accepted and billed the made-up
upstream as an (idle) row of GPU dollars, exit 0 (QA pass 3); it is now one line naming the flag, the
name and the upstreams the config has, exit 2. A known upstream is priced as before."""

from __future__ import annotations

import argparse
import io
from datetime import UTC, datetime
from typing import Any

import pytest

from oculis import parse_config
from oculis_cli import cost
from oculis_cli.clusterinputs import WindowInputs
from oculis_cli.cost_sources import Catalog
from oculis_measure.cost.core import Counters

CONFIG = ("oculis:\n  upstreams:\n    - {name: llama, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}\n"
          "    - {name: big, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}\n  routes: []\n")


def run(monkeypatch: pytest.MonkeyPatch, gpu: list[str]) -> tuple[int, str]:
    got = WindowInputs(datetime(2026, 12, 2, 3, 0, tzinfo=UTC), datetime(2026, 12, 2, 4, 0, tzinfo=UTC),
                       Catalog(parse_config(CONFIG, "c.yaml"), source="c.yaml"), Counters(), None)
    monkeypatch.setattr(cost, "window_inputs", lambda args, name: got)
    args: Any = argparse.Namespace(group_by="route,tier", gpu=gpu, output="json", config="c.yaml")
    out = io.StringIO()
    return cost.run(args, out), out.getvalue()


def test_a_gpu_price_for_an_upstream_the_config_lacks_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, printed = run(monkeypatch, ["nope=2.5"])
    err = capsys.readouterr().err
    assert code == 2 and printed == "" and err.count("\n") == 1, err
    assert "--gpu 'nope=2.5x1': no upstream 'nope' in c.yaml; name one of llama, big" in err


def test_a_known_upstream_is_priced(monkeypatch: pytest.MonkeyPatch) -> None:
    code, printed = run(monkeypatch, ["llama=2.5x2"])
    assert code == 0 and '"gpu_dollars": 5.0' in printed  # $2.50 x 2 GPUs x 1 h, an idle row
