"""Every benchmark under bench/ starts as README shows it (`.venv/bin/python bench/NAME.py`): its `--help` runs.
Benchmarks borrow the tests' support modules (tests/integration, tests/realengine, and through them
tests/suite); a support module that gained an import the bench's sys.path lacks broke `bench/flow_control.py`
and `bench/lora_engine.py` at start, unseen by any test (pytest's own conftest put tests/suite on the path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Servers started by other benches with positional arguments, not commands with --help.
NOT_COMMANDS = {"fake_upstream.py"}
SCRIPTS = sorted(p for p in (ROOT / "bench").glob("*.py") if p.name not in NOT_COMMANDS)


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_the_benchmark_starts(script: Path) -> None:
    proc = subprocess.run([sys.executable, str(script), "--help"], cwd="/", capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-1500:]
