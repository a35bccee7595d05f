"""A workload with explicit `requests` silently dropped what they left unused (QA3 Part 2 #20): `stages` when
every request gives its own `at` (20 Poisson arrivals gone without a word), and the top-level
prompt_tokens/output_tokens. Each is now one line naming the key and the fix, exit 2, as every other
conflicting workload key is."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis_cli.main import main
from oculis_sim import workload

TIMED = [{"prompt_tokens": 100, "output_tokens": 20, "at": 0}, {"prompt_tokens": 900, "output_tokens": 20, "at": 0.1}]


@pytest.mark.parametrize(("extra", "says"), [
    ({"stages": [{"rate": 5, "seconds": 4}]}, ["stages:", "every one of the 2 requests gives its own `at`"]),
    ({"output_tokens": 50}, ["output_tokens:", "drop the top-level output_tokens"]),
    ({"prompt_tokens": 50}, ["prompt_tokens:", "drop the top-level prompt_tokens"]),
], ids=["stages with timed requests", "output_tokens", "prompt_tokens"])
def test_what_explicit_requests_leave_unused_is_refused(extra: dict[str, object], says: list[str]) -> None:
    with pytest.raises(workload.WorkloadError) as exc:
        workload.parse({**extra, "requests": TIMED})
    assert all(s in str(exc.value) for s in says), exc.value


def test_stages_still_time_requests_without_at() -> None:
    wl = workload.parse({"stages": [{"rate": 5, "seconds": 4}], "requests": [
        {"prompt_tokens": 100, "output_tokens": 20}, {"prompt_tokens": 200, "output_tokens": 20}]})
    assert len(wl.prompt_tokens) == 2


def test_sim_fleet_says_it_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    wl = tmp_path / "mix.yaml"
    wl.write_text("output_tokens: 50\nstages: [{rate: 5, seconds: 4}]\nrequests:\n"
                  "  - {prompt_tokens: 100, output_tokens: 20, at: 0}\n")
    code = main(["sim", "fleet", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB",
                 "--replicas", "2", "--workload", str(wl)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "output_tokens" in err, err
