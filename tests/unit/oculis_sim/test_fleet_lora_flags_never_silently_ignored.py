"""`oculis sim fleet`'s LoRA flags given without `--lora-adapters` printed the base model's figures as if
they had been applied, and a negative `--lora-skew` made the last adapter the popular one (QA pass 3):
both are one line naming the flag and the fix, exit 2."""

import json
from pathlib import Path

import pytest

from oculis_cli.main import main

WORKLOAD = "prompt_tokens: 100\noutput_tokens: 8\nstages: [{rate: 5, requests: 6}]\nseed: 1\n"


def fleet(tmp: Path, *flags: str) -> list[str]:
    (tmp / "w.yaml").write_text(WORKLOAD)
    return ["sim", "fleet", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--replicas", "2",
            "--picker", "least-loaded", "--workload", str(tmp / "w.yaml"), *flags]


@pytest.mark.parametrize(("flags", "words"), [
    (["--lora-skew", "3"], ["--lora-skew:", "--lora-adapters is 0", "add --lora-adapters N"]),
    (["--max-loras", "2", "--lora-blind"], ["--max-loras, --lora-blind:", "add --lora-adapters N"]),
    (["--lora-adapters", "3", "--lora-skew", "-1"], ["--lora-skew -1", "0 (adapters drawn uniformly) or more"]),
    (["--lora-adapters", "3", "--lora-skew", "nan"], ["--lora-skew nan", "or more"]),
], ids=["skew without adapters", "slots and blind without adapters", "negative skew", "nan skew"])
def test_lora_flags_that_would_change_nothing_or_invert_the_draw_are_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], words: list[str]) -> None:
    assert main(fleet(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis sim fleet: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err


def test_lora_defaults_still_apply_when_only_adapters_are_given(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    assert main(fleet(tmp_path, "--lora-adapters", "2", "-o", "json")) == 0
    lo = json.loads(capsys.readouterr().out)["lora"]
    assert lo["max_loras"] == 1 and lo["affinity"] is True
    assert main(fleet(tmp_path)) == 0  # no LoRA flag at all: the base model, as before


def test_fleet_json_says_it_is_simulated(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`sim fleet -o json` carried no `simulated` marker (only a stderr line), unlike `sim replay -o json`."""
    assert main(fleet(tmp_path, "-o", "json")) == 0
    assert json.loads(capsys.readouterr().out)["simulated"] is True
    assert main([*fleet(tmp_path, "-o", "json")[:-6], "--picker", "random,prefix", "--workload",
                 str(tmp_path / "w.yaml"), "-o", "json"]) == 0
    assert [r["simulated"] for r in json.loads(capsys.readouterr().out)] == [True, True]
