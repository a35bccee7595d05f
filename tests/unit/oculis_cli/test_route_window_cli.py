"""`oculis route analyze`: the sample mode reads `--sample FILE` as it reads stdin; a window mode
without Prometheus is one line and exit 5; no mode at all says which flags to give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oculis_cli.main import main

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
SAMPLE = "".join(json.dumps({"prompt": p}) + "\n" for p in ["hi", "thanks", "prove Fermat's last theorem"])


def test_sample_file_and_stdin_give_the_same_report(tmp_path: Path) -> None:
    sample = tmp_path / "sample.jsonl"
    sample.write_text(SAMPLE)
    base = [sys.executable, "-m", "oculis_cli.main", "route", "analyze", "--config", str(SEED), "--route", "adaptive",
            "-o", "json"]
    from_file = subprocess.run([*base, "--sample", str(sample)], capture_output=True, text=True, check=True)
    from_stdin = subprocess.run(base, input=SAMPLE, capture_output=True, text=True, check=True)
    assert json.loads(from_file.stdout) == json.loads(from_stdin.stdout)
    assert json.loads(from_file.stdout)["prompts"] == 3


def test_a_missing_sample_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "analyze", "--config", str(SEED), "--route", "adaptive", "--sample",
                 str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "cannot read --sample" in err and len(err.strip().splitlines()) == 1


def test_no_config_and_no_window_names_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "analyze", "--route", "adaptive"]) == 2
    assert "--config FILE" in capsys.readouterr().err


def test_window_mode_with_prometheus_down_exits_5(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "analyze", "--route", "adaptive", "--from", "2026-11-24T00:00:00Z", "--config", str(SEED),
                 "--prometheus-url", "http://127.0.0.1:9"]) == 5
    err = capsys.readouterr().err
    assert "unreachable" in err and len(err.strip().splitlines()) == 1
    assert main(["route", "analyze", "--route", "adaptive", "--from", "yesterday", "--config", str(SEED)]) == 2
    assert "RFC 3339" in capsys.readouterr().err
