"""Benchmark arithmetic, pure: per-request samples -> metrics, SLO expressions -> goodput and gates, and
baseline vs current -> delta per metric and one verdict (PASS / FAIL / INCONCLUSIVE) naming its reason.

Metric names and formulas follow vLLM's `bench serve` (so a `--save-result` file can be the baseline):
  ttft  = first content chunk - send (client side)
  tpot  = (e2e - ttft) / (output tokens - 1), per request; requests with <= 1 output token have none
  itl   = gaps between content chunks, pooled over all requests
  e2e   = last byte - send (vLLM's e2el)
  throughput_tok_s = output tokens of the measured requests / the measured window
The measured window runs from the end of the warm-up until the later of the planned end of sending and
the end of the last measured request of any outcome (succeeded, failed, or cut at the drain timeout), so
failures never shrink it: every rate has the same denominator (measured_window).
Percentiles are numpy's linear ones (vLLM's). A request cut at the drain timeout is at least as slow as
its time in flight until the cut: TTFT and E2E count it at that lower bound (so the percentiles are lower
bounds too, and a run cannot look faster by stalling more). Goodput counts a request good when it
succeeded and met every per-request latency SLO; errors and cut requests count as missed:
goodput_share = good / measured requests.

Comparisons carry intervals (intervals.py: bootstrap over requests or time windows, widened to the
between-run noise floor of repeated runs); the verdict reads the intervals, not the point changes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from oculis_measure.figures import Absent, dist, share
from oculis_measure.figures import text as figure_text
from oculis_measure.inputs import InputError

PERCENTILES = (50, 90, 95, 99)
LATENCY = ("ttft", "tpot", "itl", "e2e")
FORMULAS = {
    "ttft_ms": "first content chunk - send (a request cut at the drain: its time in flight, a lower bound)",
    "tpot_ms": "(e2e - ttft) / (output tokens - 1), per request",
    "itl_ms": "gap between content chunks, pooled",
    "e2e_ms": "last byte - send (a request cut at the drain: its time in flight, a lower bound)",
    "throughput_tok_s": "output tokens / measured window",
    "goodput_rps": "requests meeting every SLO / measured window",
    "goodput_share": "requests meeting every SLO / measured requests (failed and cut ones missed)",
    "window": "warm-up end -> the later of the planned end of sending and the last measured request's end "
              "(any outcome)",
}


@dataclass(slots=True)
class RequestResult:
    index: int
    sent_s: float  # seconds from the run's start
    scheduled_s: float | None = None  # open loop: when it was due (lag = sent - scheduled)
    ok: bool = False
    error: str | None = None  # kind: http_429, http_5xx, timeout, connection, stream_error, ...
    error_detail: str | None = None  # the start of the server's error body, for the one-line diagnosis
    ended_s: float | None = None  # seconds from the run's start when it ended, any outcome (cancelled: the cut)
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    upstream: str | None = None
    cost: float | None = None
    warmup: bool = False  # sent before the warm-up ended: not measured
    cancelled: bool = False  # still in flight when the drain timed out: neither good nor bad
    simulated: bool = False
    usage: Any = None  # the upstream's usage (oculis_router.usage.Usage), priced after the run
    usage_estimated: bool = False  # the answer came without usage: its tokens are estimated from the text

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


# ---- SLOs ------------------------------------------------------------------------------------------------

_SLO = re.compile(r"^\s*([a-z][a-z0-9_]*?)(?:_(p\d{1,2}(?:\.\d+)?|mean|max))?\s*(<=|>=|<|>)\s*"
                  r"(\d+(?:\.\d+)?)\s*(ms|s|%)?\s*$")
_AGGREGATE = {"throughput_tok_s", "requests_per_s", "goodput_rps", "goodput_share", "error_rate",
              "cost_per_1k_requests"}


@dataclass(frozen=True, slots=True)
class Slo:
    metric: str  # ttft / tpot / itl / e2e, or an aggregate name
    stat: str | None  # p95, mean, max for latency metrics
    op: str
    value: float  # ms for latency, a fraction for error_rate and goodput_share
    text: str

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.stat}" if self.stat else self.metric

    def holds(self, observed: float) -> bool:
        return {"<": observed < self.value, "<=": observed <= self.value, ">": observed > self.value,
                ">=": observed >= self.value}[self.op]

    def per_request(self) -> bool:
        """Latency SLOs also judge each request (its own ttft, tpot, e2e) for goodput."""
        return self.metric in LATENCY and self.op in ("<", "<=")


def parse_slos(text: str) -> list[Slo]:
    """`ttft_p95<1500ms,itl_p95<60ms,e2e_p99<=5s,error_rate<1%,throughput_tok_s>=500`; InputError naming the
    bad term and the form otherwise."""
    out: list[Slo] = []
    hint = ("write METRIC[_pNN|_mean|_max] OP VALUE[ms|s|%], e.g. ttft_p95<1500ms,e2e_p99<=5s,error_rate<1%; "
            f"metrics: {', '.join(LATENCY)} (with a percentile) or {', '.join(sorted(_AGGREGATE))}")
    for term in text.split(","):
        if not term.strip():
            continue
        m = _SLO.match(term)
        if not m:
            raise InputError(f"--slo {term.strip()!r} is not an SLO; {hint}")
        metric, stat, op, number, unit = m.groups()
        value = float(number)
        if metric in LATENCY:
            if stat is None:
                raise InputError(f"--slo {term.strip()!r}: say which statistic, e.g. {metric}_p95{op}{number}"
                                 f"{unit or 'ms'}")
            if unit not in ("ms", "s"):
                raise InputError(f"--slo {term.strip()!r}: a latency needs a unit, ms or s (e.g. {value:g}ms)")
            value = value * 1000 if unit == "s" else value
        elif metric in _AGGREGATE and stat is None:
            if unit in ("ms", "s"):
                raise InputError(f"--slo {term.strip()!r}: {metric} is not a time; drop the unit {unit!r}")
            if metric in ("error_rate", "goodput_share"):
                value = value / 100 if unit == "%" else value
            elif unit == "%":
                raise InputError(f"--slo {term.strip()!r}: {metric} is not a share; drop the %")
        else:
            raise InputError(f"--slo {term.strip()!r}: unknown metric {m.group(1) + ('_' + stat if stat else '')!r}; "
                             f"{hint}")
        out.append(Slo(metric, stat, op, value, term.strip()))
    if not out:
        raise InputError(f"--slo {text!r} is empty; {hint}")
    return out


def _good(r: RequestResult, slos: list[Slo]) -> bool:
    if not r.ok:
        return False
    for s in slos:
        if not s.per_request():
            continue
        per_req = {"ttft": r.ttft_s, "e2e": r.e2e_s, "tpot": r.tpot_s, "itl": r.tpot_s}[s.metric]
        if per_req is not None and not s.holds(per_req * 1000):  # none (<= 1 token): nothing to miss
            return False
    return True


# ---- metrics ---------------------------------------------------------------------------------------------

def _dist(values_s: list[float], reason: str = "no measured request succeeded") -> dict[str, float] | Absent:
    """mean and percentiles in ms; Absent(reason) for no samples (figures.py: never a number)."""
    return dist(values_s, reason, PERCENTILES, scale=1000.0, digits=None)


def _in_flight(r: RequestResult) -> float | None:
    return None if r.ended_s is None else max(r.ended_s - r.sent_s, 0.0)


def _ttft_bound(r: RequestResult) -> float | None:
    """A succeeded request's TTFT; a cut one's, or its time in flight (a lower bound) if no token came."""
    if r.ok or (r.cancelled and r.ttft_s is not None):
        return r.ttft_s
    return _in_flight(r) if r.cancelled else None


def _e2e_bound(r: RequestResult) -> float | None:
    """A succeeded request's E2E; a cut one's time in flight until the cut (a lower bound)."""
    return r.e2e_s if r.ok else _in_flight(r) if r.cancelled else None


def good(r: RequestResult, slos: list[Slo]) -> bool:
    return _good(r, slos)


def measured_window(results: list[RequestResult], warmup_s: float, duration_s: float) -> dict[str, float]:
    """The window every rate divides by: from the end of the warm-up until the later of the planned end
    of sending (warm-up + duration) and the end of the last measured request, whatever its outcome. A
    failure ends a request as much as a success does, so failing fast never shrinks the window."""
    planned_end = warmup_s + duration_s
    ends = [r.ended_s for r in results if not r.warmup and r.ended_s is not None]
    end = max([planned_end, *ends])
    return {"window_s": end - warmup_s, "sending_s": duration_s, "drain_s": end - planned_end}


def summarize(results: list[RequestResult], window_s: float, *, slos: list[Slo] | None = None,
              requested_rate: float | None = None, send_window_s: float | None = None) -> dict[str, Any]:
    """The metrics of the measured requests (warm-up excluded) over the measured window (seconds)."""
    slos = slos or []
    measured = [r for r in results if not r.warmup]
    done = [r for r in measured if not r.cancelled]
    ok = [r for r in done if r.ok]
    failed = [r for r in done if not r.ok]
    window = max(window_s, 1e-9)
    by_kind: dict[str, int] = {}
    for r in failed:
        by_kind[r.error or "unknown"] = by_kind.get(r.error or "unknown", 0) + 1
    good = sum(1 for r in done if _good(r, slos))
    costs = [r.cost for r in ok if r.cost is not None]
    lags = [r.sent_s - r.scheduled_s for r in measured if r.scheduled_s is not None]
    sent_rate = len(measured) / send_window_s if send_window_s else None
    out: dict[str, Any] = {
        "duration_s": window_s,
        "requests": {"measured": len(measured), "succeeded": len(ok), "failed": len(failed),
                     "cancelled": len(measured) - len(done), "warmup_excluded": len(results) - len(measured)},
        "throughput_tok_s": sum(r.output_tokens for r in ok) / window,
        "requests_per_s": len(ok) / window,
        "requested_rate": requested_rate,
        "achieved_rate": sent_rate,
        "send_lag_ms": _dist(lags) if lags else None,  # None: closed loop, nothing scheduled
        "ttft_ms": _dist([v for r in measured if (v := _ttft_bound(r)) is not None]),
        "tpot_ms": _dist([t for r in ok if (t := r.tpot_s) is not None],
                         "no succeeded request had more than one output token"),
        "itl_ms": _dist([g for r in ok for g in r.itl_s], "no succeeded request had more than one content chunk"),
        "e2e_ms": _dist([v for r in measured if (v := _e2e_bound(r)) is not None]),
        "input_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": sum(r.output_tokens for r in ok),
        "cached_prompt_tokens": sum(r.cached_tokens for r in ok),
        "errors": len(failed),
        "errors_by_kind": dict(sorted(by_kind.items())),
        "error_rate": share(len(failed), len(done), "no measured request ended (all cut at the drain)"),
        "goodput_rps": good / window,
        "goodput_share": share(good, len(measured), "no request was measured"),
        "goodput_basis": "request-level latency SLOs (" + (", ".join(s.text for s in slos if s.per_request())
                                                            or "none given: every success is good") + ")",
        "cost_per_1k_requests": (sum(costs) / len(costs) * 1000) if costs and len(costs) == len(ok) else None,
        "usage_estimated": sum(1 for r in ok if r.usage_estimated),
        "simulated": any(r.simulated for r in ok),
    }
    return out


def get(metrics: dict[str, Any], key: str) -> float | None:
    """A metric by flat name: `throughput_tok_s`, `ttft_ms.p95`, `ttft_p95` (the SLO spelling)."""
    m = re.fullmatch(r"(ttft|tpot|itl|e2e)_(p\d+|mean|max)", key)
    if m:
        key = f"{m.group(1)}_ms.{m.group(2)}"
    node: Any = metrics
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else None


def check_slos(metrics: dict[str, Any], slos: list[Slo]) -> list[dict[str, Any]]:
    out = []
    for s in slos:
        observed = get(metrics, s.key)
        out.append({"slo": s.text, "observed": observed, "unit": "ms" if s.metric in LATENCY else "",
                    "met": None if observed is None else s.holds(observed)})
    return out


# ---- compare ---------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Gate:
    key: str
    better: str  # "higher" or "lower"
    kind: str  # "throughput", "latency", "errors", "cost", or "info" (reported, never fails)


GATES = (
    Gate("throughput_tok_s", "higher", "throughput"), Gate("requests_per_s", "higher", "throughput"),
    Gate("goodput_rps", "higher", "throughput"), Gate("goodput_share", "higher", "info"),
    Gate("ttft_ms.p50", "lower", "latency"), Gate("ttft_ms.p95", "lower", "latency"),
    Gate("ttft_ms.p99", "lower", "info"),
    Gate("tpot_ms.p50", "lower", "latency"), Gate("tpot_ms.p95", "lower", "latency"),
    Gate("tpot_ms.p99", "lower", "info"),
    Gate("itl_ms.p50", "lower", "info"), Gate("itl_ms.p95", "lower", "info"), Gate("itl_ms.p99", "lower", "info"),
    Gate("e2e_ms.p50", "lower", "latency"), Gate("e2e_ms.p95", "lower", "latency"),
    Gate("e2e_ms.p99", "lower", "info"),
    Gate("error_rate", "lower", "errors"), Gate("cost_per_1k_requests", "lower", "cost"),
)


@dataclass(frozen=True, slots=True)
class Tolerances:
    throughput_pct: float = 10.0  # a drop of more than this fails
    latency_pct: float = 20.0  # a rise of more than this fails ...
    latency_floor_ms: float = 5.0  # ... and of more than this many ms (tiny absolute moves are noise)
    error_rate_pp: float = 1.0  # percentage points
    cost_pct: float = 10.0
    min_requests: int = 20  # fewer succeeded requests in either run: too few to tell
    max_cancelled_share: float = 0.05  # more measured requests cut at the drain: their tail is unknown (p95)


def limit_change(g: Gate, baseline: float, tol: Tolerances) -> float:
    """The signed change of a gated figure at which it regresses: a rise for `lower` figures, a drop for
    `higher` ones."""
    if g.kind == "throughput":
        return -abs(baseline) * tol.throughput_pct / 100
    if g.kind == "latency":
        return max(abs(baseline) * tol.latency_pct / 100, tol.latency_floor_ms)
    if g.kind == "errors":
        return tol.error_rate_pp / 100
    return abs(baseline) * tol.cost_pct / 100


def delta(baseline: dict[str, Any], current: dict[str, Any], tol: Tolerances,
          base_runs: list[dict[str, Any]] | None = None,
          cur_runs: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """Per gated metric: baseline, current, change, change_pct and status (ok / improved / regressed /
    unsure / info), direction-aware: for `lower` metrics a rise is worse. With both runs' per-request
    samples (`runs` of a --save file) each figure carries its change's interval and the status reads
    it (intervals.judge); without them (a vLLM file) the point values are compared."""
    out: dict[str, dict[str, Any]] = {}
    slack = 0.0
    if base_runs and cur_runs:
        from oculis_measure.bench.intervals import machine_slack_ms

        slack = machine_slack_ms(base_runs, cur_runs)
    for g in GATES:
        judged = None
        if base_runs and cur_runs and g.kind != "info":
            from oculis_measure.bench.intervals import judge

            judged = judge(g.key, lambda b, g=g: limit_change(g, b, tol), g.better,  # type: ignore[misc]
                           base_runs, cur_runs, slack_ms=slack)
        b, c = get(baseline, g.key), get(current, g.key)
        if judged is not None:
            b, c = judged.baseline, judged.current
        if b is None or c is None:
            continue
        change = c - b
        pct = (change / b * 100) if b else (0.0 if change == 0 else math.copysign(math.inf, change))
        worse = change < 0 if g.better == "higher" else change > 0
        # beyond the limit either way: a move inside it is noise, neither a regression nor an improvement
        if g.kind == "throughput":
            beyond = abs(pct) > tol.throughput_pct
        elif g.kind == "latency":
            beyond = abs(pct) > tol.latency_pct and abs(change) > tol.latency_floor_ms
        elif g.kind == "errors":
            beyond = abs(change) * 100 > tol.error_rate_pp
        elif g.kind == "cost":
            beyond = abs(pct) > tol.cost_pct
        else:
            beyond = False
        status = "info" if g.kind == "info" else ("regressed" if worse and beyond else
                                                  "improved" if beyond else "ok")
        limit = {"throughput": f"-{tol.throughput_pct:g}%", "latency": f"+{tol.latency_pct:g}% and "
                 f"+{tol.latency_floor_ms:g}ms", "errors": f"+{tol.error_rate_pp:g}pp",
                 "cost": f"+{tol.cost_pct:g}%"}.get(g.kind)
        out[g.key] = {"baseline": b, "current": c, "change": change,
                      "change_pct": None if math.isinf(pct) else pct, "better": g.better, "status": status,
                      "limit": limit, **(judged.as_dict() if judged is not None else {})}
    return out


FINGERPRINT_FIELDS = ("profile", "dataset_hash", "seed", "route", "duration_s", "warmup_s", "load", "salted")
# A fingerprint written before a field existed had that field's old value: runs were not salted then.
FINGERPRINT_DEFAULTS: dict[str, Any] = {"salted": False}


def num(v: float) -> str:
    """A figure as the table prints it: thousands separators, one decimal from 1 up, 3 significant below."""
    return f"{v:,.1f}" if abs(v) >= 1 else f"{v:.3g}"


def _interval(d: dict[str, Any]) -> str:
    return f"[{d['change_low']:+,.4g}, {d['change_high']:+,.4g}]" if "change_low" in d else ""


def verdict(current: dict[str, Any], fingerprint: dict[str, Any], slo_results: list[dict[str, Any]],
            baseline: dict[str, Any] | None, baseline_fingerprint: dict[str, Any] | None,
            deltas: dict[str, dict[str, Any]] | None, tol: Tolerances) -> tuple[str | None, list[str]]:
    """(verdict, reasons, the binding one first). None when there is nothing to judge (no --slo and no
    --compare) and some request succeeded.

    In order: a missed SLO fails on its own. A comparison that cannot mean anything is INCONCLUSIVE (no
    request succeeded, another workload, simulated vs real, no fingerprint). Then a figure whose change's
    interval lies past its limit FAILs, whatever else: cut requests enter the figures at a lower bound of
    their latency and as missed goodput, so the figures are optimistic and a regression they show is real.
    Only then is the run INCONCLUSIVE for lack of data (fewer than --min-requests succeeded, more than
    max_cancelled_share cut at the drain, an interval across its limit, naming what would settle it), and
    PASS when every interval lies inside its limit. A comparison without per-request samples (a vLLM
    baseline) is judged on its point values, and too few requests then block a FAIL too."""
    reasons: list[str] = []
    failed = [r for r in slo_results if r["met"] is False]
    unmeasured = [r for r in slo_results if r["met"] is None]
    reasons += [f"SLO {r['slo']} missed: observed {num(r['observed'])}{r.get('unit', '')}" for r in failed]
    blocking: list[str] = [f"SLO {r['slo']}: not measured in this run" for r in unmeasured]
    soft: list[str] = []
    judging = baseline is not None or bool(slo_results)
    succeeded = int(get(current, "requests.succeeded") or 0)
    measured = int(get(current, "requests.measured") or 0)
    cancelled = int(get(current, "requests.cancelled") or 0)
    with_intervals = any("change_low" in d for d in (deltas or {}).values())
    if succeeded == 0:
        blocking.append(f"no measured request succeeded ({measured} measured, {cancelled} cut at the drain "
                        "timeout): there is nothing to judge")
    elif judging and succeeded < tol.min_requests:
        (soft if with_intervals else blocking).append(
            f"the current run has {succeeded} succeeded requests (< --min-requests {tol.min_requests}): too few "
            "for its percentiles; run longer or at a higher rate")
    if measured and cancelled / measured > tol.max_cancelled_share:
        soft.append(f"{cancelled} of {measured} measured requests ({100 * cancelled / measured:.0f}%) were cut at "
                    "the drain timeout: their latency is known only as a lower bound, so the figures may be "
                    "better than the truth; raise --drain-timeout or lower the load")
    if baseline is not None:
        if baseline_fingerprint is None:
            blocking.append("the baseline has no workload fingerprint (not an `oculis bench run --save` "
                            "file); rerun the baseline with --save, or pass --force-compare")
        else:
            diff = [k for k in FINGERPRINT_FIELDS if baseline_fingerprint.get(k, FINGERPRINT_DEFAULTS.get(k))
                    != fingerprint.get(k, FINGERPRINT_DEFAULTS.get(k))]
            if diff:
                blocking.append("workload mismatch: " + ", ".join(
                    f"{k} {baseline_fingerprint.get(k, FINGERPRINT_DEFAULTS.get(k))!r} vs "
                    f"{fingerprint.get(k, FINGERPRINT_DEFAULTS.get(k))!r}" for k in diff)
                    + "; rerun with the baseline's profile, seed, route, duration, load and prompt salting")
        known = baseline.get("simulated") is not None  # a vLLM file cannot say whether its server was simulated
        if known and bool(baseline.get("simulated")) != bool(current.get("simulated")):
            blocking.append("one run is simulated and the other is not; compare like with like")
        n = int(get(baseline, "requests.succeeded") or get(baseline, "completed") or 0)
        if n < tol.min_requests:
            (soft if with_intervals else blocking).append(
                f"the baseline run has {n} succeeded requests (< --min-requests {tol.min_requests}); run longer "
                "or at a higher rate")
        for key, d in (deltas or {}).items():
            pct = "" if d["change_pct"] is None else f" ({d['change_pct']:+.1f}%)"
            if d["status"] == "regressed":
                reasons.append(f"{key} {num(d['baseline'])} -> {num(d['current'])}{pct}, " + (
                    f"change interval {_interval(d)} past the limit {d['limit']}" if "change_low" in d
                    else f"limit {d['limit']}"))
            elif d["status"] == "unsure":
                soft.append(f"{key} {num(d['baseline'])} -> {num(d['current'])}{pct}: change interval "
                            f"{_interval(d)} against the limit {d['limit']}: {d['settle']}")
    if succeeded == 0 and judging:  # nothing succeeded: the one line naming why comes first, SLOs or not
        return "INCONCLUSIVE", blocking + soft + reasons
    if failed:
        return "FAIL", reasons + blocking + soft
    if blocking:
        return "INCONCLUSIVE", blocking + soft + reasons
    if reasons:
        return "FAIL", reasons + soft
    if soft:
        return "INCONCLUSIVE", soft
    if not judging:
        return None, ["no --compare and no --slo: nothing to judge"]
    passed = (["every SLO met"] if slo_results else []) + (
        ["every figure's change interval lies inside its limit" if with_intervals else
         "no metric regressed beyond its limit"] if baseline is not None else [])
    return "PASS", passed


def baseline_runs(data: Any) -> list[dict[str, Any]] | None:
    """The per-request samples of each run of an `oculis bench run --save` file (None: a vLLM file or a
    file saved before runs were kept)."""
    runs = data.get("runs") if isinstance(data, dict) else None
    if isinstance(runs, list) and runs and all(isinstance(r, dict) and "outcome" in r for r in runs):
        return runs
    return None


def comparison_rows(doc: dict[str, Any]) -> list[tuple[str, Any, Any, Any, Any, str]]:
    """(metric, baseline, current, change, change %, status) of a run's document: the rows of the CLI's
    table, its CSV and the HTML report."""
    cur, base, deltas = doc["current"], doc.get("baseline"), doc.get("delta") or {}
    keys = ["throughput_tok_s", "requests_per_s", "goodput_rps", "goodput_share",
            *[f"{m}_ms.{s}" for m in ("ttft", "tpot", "itl", "e2e") for s in ("p50", "p95", "p99")],
            "errors", "error_rate", "cost_per_1k_requests"]
    out = []
    for k in keys:
        d = deltas.get(k, {})
        out.append((k, get(base, k) if base else None, get(cur, k), d.get("change"), d.get("change_pct"),
                    d.get("status", "")))
    return out



def fmt(v: Any, nd: int = 1) -> str:
    """A figure of the table: `-` when absent (figures.text), whole numbers as they are."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return figure_text(v, f",.{nd}f")


def table_cells(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of the comparison table as text, as the CLI and the HTML report print it: metrics
    with no value in either run left out, shares and cost to 3 decimals, errors whole. A comparison with
    samples adds the change's 95 % interval and the noise floor (the figure's standard deviation between
    the baseline's repeated runs; `-` when it ran once); a saved run repeated alone adds its noise floor."""
    compare = doc.get("baseline") is not None
    deltas = doc.get("delta") or {}
    intervals = compare and any("change_low" in d for d in deltas.values())
    floor = doc.get("noise_floor") or {}
    noise_col = intervals or (not compare and any(v is not None for v in floor.values()))
    cols = ["metric", *(["baseline"] if compare else []), "current", *(["delta"] if compare else []),
            *(["95% interval"] if intervals else []), *(["noise sd"] if noise_col else []),
            *([""] if compare else [])]
    rows = []
    for k, b, c, ch, pct, status in comparison_rows(doc):
        if c is None and b is None:
            continue
        nd = 3 if k in ("goodput_share", "error_rate", "cost_per_1k_requests") else 0 if k == "errors" else 1
        cells = [k, *([fmt(b, nd)] if compare else []), fmt(c, nd)]
        if compare:
            cells += ["-" if ch is None else f"{ch:+,.{nd}f}" + ("" if pct is None else f" ({pct:+.1f}%)")]
        d = deltas.get(k, {})
        if intervals:
            cells.append(f"[{d['change_low']:+,.{nd}f}, {d['change_high']:+,.{nd}f}]" if "change_low" in d
                         else "-")
        if noise_col:
            sd = d.get("noise_sd") if compare else floor.get(k)
            cells.append(fmt(sd, nd))
        if compare:
            cells.append(status)
        rows.append(cells)
    return cols, rows


# ---- baselines -------------------------------------------------------------------------------------------

def from_vllm(data: dict[str, Any]) -> dict[str, Any]:
    """Metrics from a `vllm bench serve --save-result` file, in this module's names."""
    def dist(name: str) -> dict[str, float | None]:
        out: dict[str, float | None] = {"mean": data.get(f"mean_{name}_ms")}
        for p in PERCENTILES:
            v = data.get(f"p{p}_{name}_ms")
            out[f"p{p}"] = data.get(f"median_{name}_ms") if v is None and p == 50 else v
        return out

    completed, failed = int(data.get("completed") or 0), int(data.get("failed") or 0)
    return {"duration_s": data.get("duration"), "throughput_tok_s": data.get("output_throughput"),
            "requests_per_s": data.get("request_throughput"), "goodput_rps": data.get("request_goodput"),
            "ttft_ms": dist("ttft"), "tpot_ms": dist("tpot"), "itl_ms": dist("itl"), "e2e_ms": dist("e2el"),
            "requests": {"succeeded": completed, "failed": failed}, "errors": failed,
            "error_rate": failed / (completed + failed) if completed + failed else 0.0,
            "cost_per_1k_requests": None, "simulated": None, "source": "vllm bench serve --save-result"}


def read_baseline(data: Any, path: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(metrics, workload fingerprint or None) from an `oculis bench run --save` file or a vLLM one."""
    if isinstance(data, dict) and isinstance(data.get("current"), dict):
        fp = data.get("workload")
        return data["current"], fp if isinstance(fp, dict) else None
    if isinstance(data, dict) and "output_throughput" in data and "request_throughput" in data:
        return from_vllm(data), None
    raise InputError(f"--compare {path}: neither an `oculis bench run --save` file (no 'current') nor a "
                     "`vllm bench serve --save-result` file (no 'output_throughput'); give one of those")
