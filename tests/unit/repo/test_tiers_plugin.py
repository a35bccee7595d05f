"""The suite's plugin (tests/suite/tiers_plugin.py) run on a small suite of its own in a child pytest: under
CI=true a removable skip fails (marker, skip_or_fail, an untagged pytest.skip), an inherent one stays a
skip, and the table per tier is written as JSON; without CI all three skip."""

import json
import os
import subprocess
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parents[2] / "suite"
TESTS = '''
import pytest
from skips import inherent, needs_command, skip_or_fail

@needs_command("oculis-no-such-program", "oculis-no-such-package")
def test_removable_by_marker(): pass

def test_inherent(): skip_or_fail(inherent("this machine is not x86_64"))

def test_untagged(): pytest.skip("nobody said why")

def test_passes(): pass
'''


def run(tmp_path: Path, ci: str) -> tuple[subprocess.CompletedProcess[str], dict]:  # type: ignore[type-arg]
    (tmp_path / "tests" / "unit").mkdir(parents=True, exist_ok=True)
    (tmp_path / "tests" / "unit" / "test_small.py").write_text(TESTS)
    out = tmp_path / f"tiers-{ci or 'none'}.json"
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI")}, "CI": ci,
           "PYTHONPATH": str(SUITE), "OCULIS_TEST_TIERS_JSON": str(out),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # only pytest and ours: a second, not ten, per run
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "tiers_plugin", "-p", "no:cacheprovider", "-q", "-ra",
                           "tests"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    return proc, json.loads(out.read_text())


def test_under_ci_a_removable_skip_fails_and_an_inherent_one_is_listed(tmp_path: Path) -> None:
    proc, doc = run(tmp_path, "true")
    assert proc.returncode == 1, proc.stdout
    unit = doc["tiers"]["unit"]
    assert (unit["passed"], unit["failed"], unit["skipped"]) == (1, 2, 1), proc.stdout
    assert unit["skips"] == [{"reason": "inherent: this machine is not x86_64", "cause": "inherent", "tests": 1}]
    assert "oculis-no-such-program not installed; apt-get install oculis-no-such-package" in proc.stdout
    assert "a skip without a cause counts as removable" in proc.stdout
    assert "test_small.py:8: inherent: this machine is not x86_64" in proc.stdout  # the test's line, not ours
    assert "tier          passed  failed  skipped" in proc.stdout  # the table, printed


def test_without_ci_every_skip_is_a_skip_with_its_reason_once(tmp_path: Path) -> None:
    proc, doc = run(tmp_path, "")
    assert proc.returncode == 0, proc.stdout
    unit = doc["tiers"]["unit"]
    assert (unit["passed"], unit["failed"], unit["skipped"]) == (1, 0, 3)
    assert {s["cause"] for s in unit["skips"]} == {"inherent", "removable"} and len(unit["skips"]) == 3
    assert doc["tiers"]["integration"] == {"label": "integration", "passed": 0, "failed": 0, "skipped": 0, "ran": 0,
                                           "runnable": True, "skips": []}


def test_the_per_test_timeout_scales_with_the_knob(tmp_path: Path) -> None:
    # pytest-timeout's bound of 1 s, times OCULIS_TEST_TIME_SCALE=4 (and the machine's load): a 2 s test passes.
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_slow.py").write_text("import time\n\ndef test_two_seconds(): time.sleep(2)\n")
    env = {**{k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CI")},
           "PYTHONPATH": str(SUITE), "OCULIS_TEST_TIERS_JSON": str(tmp_path / "t.json"),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "OCULIS_TEST_TIME_SCALE": "4"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "pytest_timeout", "-p", "tiers_plugin", "-p",
                           "no:cacheprovider", "-q", "--timeout", "1", "tests"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout
