"""`route analyze --since` ran with `--shares` (or `--sample`) and said nothing of it, printing no suggested
thresholds (QA3 Part 2 #13): the router's counters hold no per-request complexity to place thresholds by. Both
are now one line naming the flag and the fix, exit 2, before any Prometheus query."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis_cli.main import main

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"


@pytest.mark.parametrize("extra", [["--shares", "0.5,0.6"], ["--sample", "prompts.jsonl"]], ids=["shares", "sample"])
def test_a_sample_flag_with_a_window_is_one_line(extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["route", "analyze", "--config", str(SEED), "--route", "adaptive", "--since", "1h",
                 "--prometheus-url", "http://127.0.0.1:1", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and f"{extra[0]} {extra[1]}" in err and "--sample FILE" in err
