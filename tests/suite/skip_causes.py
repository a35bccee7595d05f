"""Why a test skips, and whether that may hide it: the pure decision behind "a test run never hides a tier".

A skip's cause is either *inherent* (this machine can never run the test: no AVX-512, not x86_64, no
CPython 3.11) or *removable* (the machine could: a Debian package, a pip extra, the routing data beside
the clone, a folder or installer step not done yet). Under CI a removable cause fails the test instead
of skipping it, so a tier cannot go quietly missing from a green run; an inherent one is a skip, listed
in the tier table (tier_table.py).

The cause travels inside pytest's skip reason as a prefix (`inherent: ...`, `removable: ...`) so markers,
`pytest.skip` and the installer's recorded reason (tests/realengine/install.sh) all carry it the same
way. A reason without a prefix (a skip nobody classified, `importorskip` in a module) counts as
removable: a skip must say it is inherent to be let through under CI.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


class Cause(enum.StrEnum):
    INHERENT = "inherent"
    REMOVABLE = "removable"


@dataclass(frozen=True, slots=True)
class SkipCause:
    reason: str  # what is missing, in a user's words
    cause: Cause
    fix: str = ""  # how to remove it (empty for an inherent cause)
    classified: bool = True  # False: a bare reason nobody tagged (counted as removable)

    def render(self) -> str:
        """The skip reason pytest shows (and parse() reads back)."""
        fix = f" (fix: {self.fix})" if self.fix else ""
        return f"{self.cause.value}: {self.reason}{fix}"


def inherent(reason: str) -> SkipCause:
    return SkipCause(reason, Cause.INHERENT)


def removable(reason: str, fix: str) -> SkipCause:
    return SkipCause(reason, Cause.REMOVABLE, fix)


def parse(text: str) -> SkipCause:
    """A skip reason as pytest reports it ("Skipped: " prefix or not) back into its cause."""
    text = text.strip()
    text = text.removeprefix("Skipped: ").strip()
    for cause in Cause:
        head = f"{cause.value}: "
        if text.startswith(head):
            body = text[len(head):]
            reason, sep, fix = body.partition(" (fix: ")
            return SkipCause(reason, cause, fix.removesuffix(")") if sep else "")
    return SkipCause(text, Cause.REMOVABLE, classified=False)


def under_ci(environ: Mapping[str, str] = os.environ) -> bool:
    """CI=true (or 1/yes), as CI services and .ci/run set it."""
    return environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def verdict(skip: SkipCause, ci: bool) -> Literal["skip", "fail"]:
    """Fail where the run would otherwise hide a test this machine could run."""
    return "fail" if ci and skip.cause is Cause.REMOVABLE else "skip"


def failure_message(skip: SkipCause) -> str:
    why = "" if skip.classified else \
        " (a skip without a cause counts as removable: give it one with tests/suite/skips.py)"
    fix = f"; {skip.fix}" if skip.fix else ""
    return f"CI=true and this skip's cause can be removed on this machine{why}: {skip.reason}{fix}"
