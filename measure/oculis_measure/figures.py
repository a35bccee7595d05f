"""One rule, for every command, on figures that cannot exist: a latency of no completed request, a rate over
an empty window, a percentile of no samples, a share over zero requests. Such a figure is `Absent`, with
its reason, never a number: 0.0 ms would read as "instant", 0 % as "never", and a NaN as a bug. Text
prints it as `-`; JSON as `null`, the reasons gathered under `"absent"` (path -> reason), so a reader of
either knows why.

Producers compute figures with `ratio`, `share`, `rate`, `dist`; the shells print with `text` and
serialise with `json_ready`. Pure, no I/O; numpy only where a distribution is asked for."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

DASH = "-"


@dataclass(frozen=True, slots=True)
class Absent:
    """A figure that does not exist, and why (e.g. "no request completed")."""

    reason: str

    def __repr__(self) -> str:
        return f"absent({self.reason!r})"


Figure = float | int | Absent


def absent(reason: str) -> Absent:
    return Absent(reason)


def known(v: Any) -> TypeGuard[float]:
    """A figure that exists: a finite number (not Absent, not None, not NaN or infinite)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def ratio(num: float, den: float, reason: str, digits: int | None = None) -> float | Absent:
    """num / den, or Absent(reason) when den is zero (or either is not a number)."""
    if not known(num) or not known(den) or den == 0:
        return Absent(reason)
    v = num / den
    return round(v, digits) if digits is not None else v


def share(part: float, whole: float, reason: str, digits: int | None = None) -> float | Absent:
    """A share of a whole: Absent when the whole is zero (a share over zero requests is no share)."""
    return ratio(part, whole, reason, digits)


def rate(amount: float, seconds: float, reason: str, digits: int | None = None) -> float | Absent:
    """Per second over a window: Absent when the window is empty or not positive."""
    if not known(seconds) or seconds <= 0:
        return Absent(reason)
    return ratio(amount, seconds, reason, digits)


def latency(value_ms: float | None, reason: str) -> float | Absent:
    """A latency: Absent when missing or not finite; a latency of nothing measured is never 0.0."""
    return value_ms if value_ms is not None and known(value_ms) else Absent(reason)


def dist(values: Sequence[float] | Iterable[float], reason: str, percentiles: Sequence[float] = (50, 90, 99),
         scale: float = 1.0, digits: int | None = 3) -> dict[str, float] | Absent:
    """{"mean", "p50", ...} of the values times `scale` (numpy's linear percentiles), or Absent(reason)
    when there are none: a percentile of no samples does not exist."""
    import numpy as np

    arr = np.asarray(list(values), dtype=float) * scale
    if arr.size == 0:
        return Absent(reason)
    qs = np.percentile(arr, list(percentiles))
    out = {"mean": float(arr.mean()), **{f"p{p:g}": float(q) for p, q in zip(percentiles, qs, strict=True)}}
    return {k: round(v, digits) for k, v in out.items()} if digits is not None else out


def pick(figure: Any, key: str) -> Any:
    """One statistic of a `dist` result: the number, or the Absent itself when the whole is absent."""
    if isinstance(figure, Absent):
        return figure
    if isinstance(figure, dict):
        return figure.get(key, Absent(f"no {key}"))
    return Absent("not measured") if figure is None else figure


def text(v: Any, spec: str = ".1f", width: int = 0, unit: str = "") -> str:
    """A figure as text: the number formatted by `spec` (e.g. ".1f", ",.0f", ".1%"), or `-` for an
    absent, missing or non-finite one; right-aligned to `width`."""
    s = f"{v:{spec}}{unit}" if known(v) else DASH
    return s.rjust(width) if width else s


def cell(v: Any) -> str:
    """A table cell: text as it is, a number as str(), `-` for an absent, missing or non-finite figure."""
    if isinstance(v, str):
        return v
    if v is None or isinstance(v, Absent) or (isinstance(v, float) and not math.isfinite(v)):
        return DASH
    return str(v)


def json_ready(doc: Any, path: str = "", reasons: dict[str, str] | None = None) -> Any:
    """`doc` for JSON: Absent and non-finite floats become None. With `reasons` given, each absent figure's
    reason is recorded under its dotted path there."""
    if isinstance(doc, Absent):
        if reasons is not None:
            reasons[path or "."] = doc.reason
        return None
    if isinstance(doc, float) and not math.isfinite(doc):
        if reasons is not None:
            reasons[path or "."] = "not a finite number"
        return None
    if isinstance(doc, dict):
        return {k: json_ready(v, f"{path}.{k}" if path else str(k), reasons) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [json_ready(v, f"{path}[{i}]", reasons) for i, v in enumerate(doc)]
    return doc


def with_reasons(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` ready for JSON with an `"absent"` map (dotted path -> reason) when any figure is absent."""
    reasons: dict[str, str] = {}
    out: dict[str, Any] = json_ready(doc, "", reasons)
    if reasons:
        out["absent"] = reasons
    return out


def reasons_of(doc: Any) -> list[str]:
    """The distinct reasons of the absent figures in `doc`, in order of appearance: the note a text
    output prints once under its table."""
    found: dict[str, str] = {}
    json_ready(doc, "", found)
    return list(dict.fromkeys(found.values()))
