"""The test run's table per tier (unit, integration, e2e, real engine, images): passed, failed, skipped and
each skip reason once with its cause. Pure: the root conftest.py feeds it each test's outcome, prints
render() and writes to_json(); `.ci/run` runs this file with --check on that JSON and fails where a tier
this machine can run ran no test (a tier is runnable unless all it did was skip for inherent causes).

    python tests/suite/tier_table.py --check build/test-tiers.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from skip_causes import Cause, parse

Status = Literal["passed", "failed", "skipped"]
TIERS: dict[str, str] = {"unit": "unit", "integration": "integration", "e2e": "e2e", "realengine": "real engine",
                         "images": "images"}
# Folder of each tier (relative to the repository); the `images` marker wins over the folder.
FOLDERS: tuple[tuple[str, str], ...] = (("tests/unit/", "unit"), ("tests/integration/", "integration"),
                                        ("tests/realengine/", "realengine"), ("e2e/tests/", "e2e"))
_RANK: dict[Status, int] = {"passed": 0, "skipped": 1, "failed": 2}
PYTEST_NO_TESTS = 5


def tier_of(nodeid: str, markers: Iterable[str] = ()) -> str | None:
    """The tier of a test id (rootdir-relative) and its marker names; None for a test outside every tier."""
    if "images" in set(markers):
        return "images"
    path = nodeid.split("::", 1)[0].replace("\\", "/")
    return next((tier for folder, tier in FOLDERS if path.startswith(folder)), None)


def worse(a: Status | None, b: Status) -> Status:
    """A test's outcome over its phases: a failed setup, call or teardown fails it; a skip beats a pass."""
    return b if a is None or _RANK[b] > _RANK[a] else a


@dataclass
class TierCounts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    skips: Counter[str] = field(default_factory=Counter)  # rendered reason -> tests skipped for it

    @property
    def ran(self) -> int:
        return self.passed + self.failed

    @property
    def runnable(self) -> bool:
        """False only where every skip is inherent and nothing ran: the machine cannot run this tier."""
        if self.ran or not self.skipped:
            return True
        return any(parse(reason).cause is Cause.REMOVABLE for reason in self.skips)


def tabulate(outcomes: Iterable[tuple[str, Status, str | None]]) -> dict[str, TierCounts]:
    """(tier, status, skip reason) per test -> counts per tier, every tier listed even when none ran."""
    table = {tier: TierCounts() for tier in TIERS}
    for tier, status, reason in outcomes:
        counts = table.setdefault(tier, TierCounts())
        setattr(counts, status, getattr(counts, status) + 1)
        if status == "skipped":
            counts.skips[parse(reason or "").render() if reason else "(no reason given)"] += 1
    return table


def render(table: Mapping[str, TierCounts]) -> list[str]:
    lines = [f"{'tier':<12} {'passed':>7} {'failed':>7} {'skipped':>8}"]
    for tier, c in table.items():
        note = "" if c.ran else "  (ran no test)" if c.runnable else "  (cannot run on this machine)"
        lines.append(f"{TIERS.get(tier, tier):<12} {c.passed:>7} {c.failed:>7} {c.skipped:>8}{note}")
    for tier, c in table.items():
        for reason, n in sorted(c.skips.items()):
            lines.append(f"  {TIERS.get(tier, tier)}: {n} skipped, {reason}")
    return lines


def to_json(table: Mapping[str, TierCounts], ci: bool, exit_status: int) -> dict[str, Any]:
    return {"ci": ci, "exit_status": exit_status, "tiers": {
        tier: {"label": TIERS.get(tier, tier), "passed": c.passed, "failed": c.failed, "skipped": c.skipped,
               "ran": c.ran, "runnable": c.runnable,
               "skips": [{"reason": r, "cause": parse(r).cause.value, "tests": n} for r, n in sorted(c.skips.items())]}
        for tier, c in table.items()}}


def problems(doc: Mapping[str, Any]) -> list[str]:
    """Why a run hid a tier: one line per runnable tier that ran no test (every tier must be listed)."""
    out = []
    if doc.get("exit_status") == PYTEST_NO_TESTS:
        out.append("pytest collected no test at all (exit 5)")
    tiers = doc.get("tiers", {})
    for tier, label in TIERS.items():
        t = tiers.get(tier)
        if t is None:
            out.append(f"tier {label}: missing from the table")
        elif t["runnable"] and not t["ran"]:
            why = "; ".join(s["reason"] for s in t["skips"]) or "no test was collected"
            out.append(f"tier {label}: ran no test although this machine can run it ({why})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fail where a test tier this machine can run ran no test.")
    ap.add_argument("--check", type=Path, required=True, help="the JSON the test run wrote (build/test-tiers.json)")
    args = ap.parse_args(argv)
    if not args.check.is_file():
        print(f"tiers: {args.check} not found: the test run wrote no tier table (did pytest start?)", file=sys.stderr)
        return 1
    found = problems(json.loads(args.check.read_text()))
    for line in found:
        print(f"tiers: {line}", file=sys.stderr)
    if not found:
        print("tiers: every tier this machine can run ran")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
