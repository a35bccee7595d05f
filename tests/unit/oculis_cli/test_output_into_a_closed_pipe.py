"""Output piped into a reader that leaves early (`oculis ... | head`) ends quietly, never a BrokenPipeError
traceback (QA3 Part 2 #14: `sim fleet`, `eval run` and `route analyze` printed one; only `capacity plan` was
clean because its output fit the pipe). A real process writes into a real pipe whose reader has closed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("argv", [
    ["eval", "run", "--config", "demo/eval-config.yaml", "--route", "mmlu", "--suite", "demo/eval-suite.jsonl"],
    ["capacity", "plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"],
], ids=["eval run", "capacity plan"])
def test_a_reader_that_leaves_ends_the_command_quietly(argv: list[str]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the first line: every write meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err
