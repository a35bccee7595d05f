"""The table per tier (tests/suite/tier_table.py) and the check `.ci/run` makes with it."""

import json
from pathlib import Path

import pytest
from skip_causes import inherent, removable
from tier_table import main, problems, render, tabulate, tier_of, to_json, worse

AVX = inherent("the CPU has no AVX-512").render()
REDIS = removable("redis-server not installed", "apt-get install redis-server").render()


def test_a_test_belongs_to_the_tier_of_its_folder_unless_marked_images() -> None:
    assert tier_of("tests/unit/oculis/test_x.py::test_a") == "unit"
    assert tier_of("tests/integration/test_router.py::test_a[1]") == "integration"
    assert tier_of("tests/realengine/test_lora_real.py::test_a") == "realengine"
    assert tier_of("e2e/tests/test_smoke.py::test_a", ["e2e"]) == "e2e"
    assert tier_of("e2e/tests/test_images.py::test_a", ["e2e", "images"]) == "images"
    assert tier_of("bench/test_other.py::test_a") is None


def test_a_tests_outcome_is_its_worst_phase() -> None:
    assert worse(None, "passed") == "passed"
    assert worse("passed", "failed") == "failed"  # a teardown that failed after a passing call
    assert worse("failed", "passed") == "failed"
    assert worse("skipped", "passed") == "skipped"


def test_every_tier_is_listed_and_each_skip_reason_once() -> None:
    table = tabulate([("unit", "passed", None), ("unit", "skipped", REDIS), ("unit", "skipped", "Skipped: " + REDIS),
                      ("realengine", "skipped", AVX), ("realengine", "skipped", AVX)])
    assert list(table) == ["unit", "integration", "e2e", "realengine", "images"]
    assert (table["unit"].passed, table["unit"].skipped, dict(table["unit"].skips)) == (1, 2, {REDIS: 2})
    assert not table["realengine"].runnable and table["integration"].runnable
    text = "\n".join(render(table))
    assert text.count("redis-server not installed") == 1
    assert "cannot run on this machine" in text and "real engine" in text


def test_a_runnable_tier_that_ran_nothing_is_a_problem_and_an_inherent_one_is_not() -> None:
    table = tabulate([("unit", "passed", None), ("integration", "passed", None), ("e2e", "failed", None),
                      ("realengine", "skipped", AVX), ("images", "skipped", REDIS)])
    assert problems(to_json(table, ci=True, exit_status=1)) == [
        "tier images: ran no test although this machine can run it (" + REDIS + ")"]
    empty = to_json(tabulate([]), ci=True, exit_status=5)
    assert problems(empty)[0] == "pytest collected no test at all (exit 5)"
    assert len(problems(empty)) == 6  # and each tier, none of which ran
    assert problems({"tiers": {}})[0] == "tier unit: missing from the table"


def test_the_check_reads_the_json_the_run_wrote(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tabulate([(t, "passed", None) for t in ("unit", "integration", "e2e", "images")]
                    + [("realengine", "skipped", AVX)])
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(to_json(good, ci=True, exit_status=0)))
    assert main(["--check", str(path)]) == 0
    assert main(["--check", str(tmp_path / "none.json")]) == 1
    assert "wrote no tier table" in capsys.readouterr().err
