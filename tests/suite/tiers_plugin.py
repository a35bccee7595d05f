"""The suite's own pytest plugin (the root conftest.py loads it for every tier): no tier hides, waits scale.

- Every skip goes through tests/suite/skip_causes.verdict: under CI=true a skip whose cause this machine
  could remove (a Debian package, a pip extra, the routing data, an installer step) fails the test; an
  inherent one (no AVX-512, not x86_64, no CPython 3.11) stays a skip.
- At the end, a table per tier (tests/suite/tier_table.py), printed and written as JSON to
  build/test-tiers.json (OCULIS_TEST_TIERS_JSON), which `.ci/run` checks.
- pytest-timeout's per-test bound is scaled like every wait (tests/suite/time_scale.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import skip_causes
import tier_table
import time_scale

# nodeid -> (tier, status so far, skip reason) for this session's tests
OUTCOMES: dict[str, tuple[str, tier_table.Status, str | None]] = {}


def pytest_configure(config: pytest.Config) -> None:
    try:  # a bad OCULIS_TEST_TIME_SCALE is one line before any test, not a failure in each
        time_scale.knob()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    OUTCOMES.clear()


def _skip_reason(rep: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = rep.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _enforce(rep: pytest.CollectReport | pytest.TestReport) -> None:
    """Under CI a removable skip becomes a failure, whatever raised it (marker, fixture, importorskip)."""
    if not rep.skipped or hasattr(rep, "wasxfail"):
        return
    cause = skip_causes.parse(_skip_reason(rep))
    if skip_causes.verdict(cause, skip_causes.under_ci()) == "fail":
        rep.outcome = "failed"
        rep.longrepr = skip_causes.failure_message(cause)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _enforce(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _enforce(outcome.get_result())


def _record(nodeid: str, markers: Any, status: tier_table.Status, reason: str | None) -> None:
    tier = tier_table.tier_of(nodeid, markers)
    if tier is None:
        return
    before = OUTCOMES.get(nodeid)
    now = tier_table.worse(before[1] if before else None, status)
    OUTCOMES[nodeid] = (tier, now, reason if status == now == "skipped" else before[2] if before else None)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each phase (setup, call, teardown) of each test: the test's outcome is its worst phase."""
    status: tier_table.Status = "failed" if report.failed else "skipped" if report.skipped else "passed"
    _record(report.nodeid, report.keywords, status, _skip_reason(report) if report.skipped else None)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed or report.skipped:  # a module that could not be imported, or skipped whole
        status: tier_table.Status = "failed" if report.failed else "skipped"
        _record(report.nodeid, (), status, _skip_reason(report) if report.skipped else None)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, Any, None]:
    # pytest-timeout reads the closest `timeout` marker in its own wrapper, inside this one.
    marker = item.get_closest_marker("timeout")
    if marker and marker.args:
        base = marker.args[0]
    else:
        try:  # --timeout, else the ini's; neither exists without pytest-timeout
            base = item.config.getoption("timeout", None) or item.config.getini("timeout")
        except ValueError:
            base = None
    if base and float(base) > 0:
        item.add_marker(pytest.mark.timeout(time_scale.scaled(float(base))), append=False)
    yield


def _json_path(config: pytest.Config) -> Path:
    given = os.environ.get("OCULIS_TEST_TIERS_JSON")
    return Path(given) if given else config.rootpath / "build" / "test-tiers.json"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if config.option.collectonly:  # nothing ran: no table to print or to overwrite
        return
    table = tier_table.tabulate(OUTCOMES.values())
    terminalreporter.section("tiers")
    for line in tier_table.render(table):
        terminalreporter.write_line(line)
    path = _json_path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(tier_table.to_json(table, skip_causes.under_ci(), int(exitstatus)), indent=1) + "\n")
    terminalreporter.write_line(f"tier table: {path}")
