"""Status conditions that keep their lastTransitionTime unless their status really changes; the time they
carry (`utc_now`) and whether a status write changes anything."""

from __future__ import annotations

import datetime
from typing import Any

ORDER = ("Ready", "CapacityOK", "Progressing", "Degraded")


def condition(status: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The condition of this type in a status, or {} when there is none."""
    found: dict[str, Any] = next((c for c in (status or {}).get("conditions", []) if c.get("type") == type_), {})
    return found


class Conditions:
    def __init__(self, previous: list[dict[str, Any]], generation: int, now: str) -> None:
        self._prev: dict[str, dict[str, Any]] = {str(c.get("type")): c for c in previous or []}
        self._new: dict[str, dict[str, Any]] = {}
        self._generation = generation
        self._now = now

    def set(self, type_: str, status: str, reason: str, message: str) -> None:
        prev = self._prev.get(type_)
        since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else self._now
        self._new[type_] = {"type": type_, "status": status, "reason": reason, "message": message[:2000],
                            "lastTransitionTime": since or self._now, "observedGeneration": self._generation}

    @property
    def items(self) -> list[dict[str, Any]]:
        merged: dict[str, dict[str, Any]] = {**self._prev, **self._new}
        return [merged[t] for t in ORDER if t in merged] + [c for t, c in merged.items() if t not in ORDER]


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_changed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    return any(old.get(k) != v for k, v in new.items())
