"""How long a test may wait: every deadline of the suite goes through scaled() or Deadline, so it grows with
the machine instead of failing on a loaded one.

One knob: OCULIS_TEST_TIME_SCALE (a number > 0, default 1) multiplies every deadline. On top of it the
machine's own load stretches a wait while it runs: the 1-minute load average over this process's cores
(at least 1, at most MAX_LOAD_FACTOR), read again at each check, and a wait never shrinks once stretched.
So a wait written as "60 s" is 60 s on an idle machine and 120 s while a second test run doubles the
load. Deadlines are ceilings for a condition: a passing test pays none of it, only a failing one waits
longer before it says so.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

ENV = "OCULIS_TEST_TIME_SCALE"
MAX_LOAD_FACTOR = 8.0


def knob(environ: Mapping[str, str] = os.environ) -> float:
    raw = environ.get(ENV, "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{ENV}={raw!r} is not a number above 0: set it like {ENV}=2 (every deadline doubled)")
    return value


def load_factor(load1: float, cores: int) -> float:
    """How much slower than idle the machine runs: runnable tasks per core, between 1 and MAX_LOAD_FACTOR."""
    return min(MAX_LOAD_FACTOR, max(1.0, load1 / max(1, cores)))


def _machine_factor() -> float:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = 0.0
    return load_factor(load1, cores)


def factor() -> float:
    """The multiplier for a deadline now: the knob times the machine's load factor."""
    return knob() * _machine_factor()


def scaled(seconds: float) -> float:
    """`seconds` as a deadline on this machine now (for a one-shot bound: a process wait, a timeout)."""
    return seconds * factor()


class Deadline:
    """A wait of `seconds` that stretches with factor() while it runs (never shrinks)."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic,
                 scale: Callable[[], float] = factor) -> None:
        self.seconds, self._clock, self._scale = seconds, clock, scale
        self.start = clock()
        self.factor = scale()

    def allowed(self) -> float:
        self.factor = max(self.factor, self._scale())
        return self.seconds * self.factor

    def elapsed(self) -> float:
        return self._clock() - self.start

    def expired(self) -> bool:
        return self.elapsed() > self.allowed()

    def left(self) -> float:
        return max(0.0, self.allowed() - self.elapsed())

    def describe(self) -> str:
        """For a timeout message: the time waited and how its bound was set."""
        return (f"{self.elapsed():.0f}s ({self.seconds:g}s x time scale {self.factor:.1f}: {ENV} "
                f"{knob():g} x machine load)")
