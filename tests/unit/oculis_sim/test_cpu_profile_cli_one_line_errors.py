"""`bench/cpu_profile.py RECORDING --engine E -o FILE` (README's refit command) with a missing or foreign
file, an engine the recording lacks or an unwritable output (QA pass 3): each was a traceback (KeyError,
IndexError, FileNotFoundError, JSONDecodeError); now one line naming it and the fix, exit 2."""

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import cpu_profile  # noqa: E402

RECORDING = ROOT / "bench" / "data" / "vllm_cpu_runs.json"


@pytest.mark.parametrize(("argv", "words"), [
    (lambda t: [str(t / "missing.json")], ["missing.json", "No such file", "--record-cpu"]),
    (lambda t: [str(t)], ["Is a directory", "--record-cpu"]),
    (lambda t: [str(ROOT / "bench" / "data" / "vllm_h100_runs.json")], ["not a CPU recording", "--record-cpu"]),
    (lambda t: [str(t / "w.yaml")], ["not a JSON recording", "--record-cpu"]),
    (lambda t: [str(RECORDING), "--engine", "roomie"], ["--engine 'roomie'", "chunky, roomy, tiny"]),
    (lambda t: [str(RECORDING), "-o", str(t / "no" / "p.json")], ["--output", "No such file", "writable"]),
], ids=["missing", "directory", "the h100 runs", "yaml", "unknown engine", "unwritable output"])
def test_cpu_profile_bad_input_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                        argv: Callable[[Path], list[str]], words: list[str]) -> None:
    (tmp_path / "w.yaml").write_text("prompt_tokens: 100\n")
    with pytest.raises(SystemExit) as exc:
        cpu_profile.main(argv(tmp_path))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert ": error: " in err and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_cpu_profile_writes_the_fit_it_prints(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cpu_profile.main([str(RECORDING), "--engine", "tiny"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert cpu_profile.main([str(RECORDING), "--engine", "tiny", "-o", str(tmp_path / "p.json")]) == 0
    assert json.loads((tmp_path / "p.json").read_text()) == printed and printed["step_s"] > 0
