"""QA pass 3, part 1, findings 7 and 8: `oculis sim fleet` inputs that changed nothing or ran without bound.
A workload key that parses but changes nothing is said on stderr (the run goes on, figures unchanged); a
replica count past the simulator's bound and a picker named twice are one line naming the flag, exit 2."""

from pathlib import Path

import pytest

from oculis_cli.main import main
from oculis_sim import workload

WORKLOAD = "prompt_tokens: 100\noutput_tokens: 8\nstages: [{rate: 5, requests: 6}]\nseed: 1\n"


def fleet(tmp: Path, text: str, *flags: str) -> list[str]:
    (tmp / "w.yaml").write_text(text)
    return ["sim", "fleet", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB",
            "--workload", str(tmp / "w.yaml"), *flags]


def test_a_workload_key_that_changes_nothing_is_said(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # finding 7: `prefix_groups: 4` without shared_prefix_tokens: groups of an empty prefix share nothing
    assert main(fleet(tmp_path, WORKLOAD + "prefix_groups: 4\n", "--replicas", "2", "--picker", "prefix")) == 0
    err = capsys.readouterr().err
    assert "warning" in err and "prefix_groups: 4 has no effect without shared_prefix_tokens" in err, err
    # with a prefix, or with fixed prompts per group (their questions repeat), the groups matter: no warning
    assert not workload.parse({"prompt_tokens": 9, "output_tokens": 1, "stages": [{"rate": 1, "requests": 2}],
                               "prefix_groups": 4, "shared_prefix_tokens": 64}).warnings
    assert not workload.parse({"prompt_tokens": 9, "output_tokens": 1, "stages": [{"rate": 1, "requests": 2}],
                               "prefix_groups": 4, "prompts_per_group": 2}).warnings
    assert not workload.parse({"prompt_tokens": 9, "output_tokens": 1, "stages": [{"rate": 1, "requests": 2}],
                               "prefix_groups": {"count": 4, "tokens": 64}}).warnings


@pytest.mark.parametrize(("flags", "words"), [
    (["--replicas", "100000", "--picker", "prefix"], ["--replicas 100000", "at most 1,024", "slice of the fleet"]),
    (["--replicas", "2", "--picker", "prefix,prefix"], ["--picker 'prefix,prefix'", "named more than once"]),
    (["--replicas", "2", "--picker", "random, prefix,random"], ["random is named more than once"]),
], ids=["replicas past the bound", "a picker twice", "a picker twice, spaced"])
def test_fleet_flags_without_bound_or_repeated_are_refused_in_one_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], words: list[str]) -> None:
    # finding 8: 100,000 replicas printed nothing for minutes; `prefix,prefix` ran the same picker twice
    assert main(fleet(tmp_path, WORKLOAD, *flags)) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis sim fleet: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err
