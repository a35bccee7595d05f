"""Intervals for `bench run --compare`, pure: per-request samples of a baseline and a current run (one or
more repeats each) -> for every gated figure the change, its 95 % interval, and whether that interval lies
past the figure's limit (regressed), inside it (ok), or across it (unsure, with the sample size that would
settle it).

Where each interval comes from:
  percentiles and means  scipy.stats.bootstrap over requests, drawn by time slot (a block bootstrap: the
                         requests of one moment share the machine's state, so slots vary independently);
  rates (tok/s, req/s, goodput)  scipy.stats.bootstrap over equal time slots of the measured windows,
                         paired slot by slot (both sides run the same seeded arrivals);
  error_rate             the same, over requests that ended (1 failed, 0 not).
A request cut at the drain timeout enters the latency samples at its time in flight until the cut, a
lower bound of its real latency (it is at least that slow), and is never good and never throughput: so a
run cannot look better by failing or stalling more. Figures computed with cut requests are optimistic,
which makes a regression they show certain (FAIL) but not an absence of one (see stats.verdict).

A percentile is judged only with MIN_TAIL samples beyond it on each side (a p95 needs 100 requests, a p99
500): a bootstrap cannot draw values past a sample's largest, so the interval of a p95 of 40 requests is
too narrow to mean anything; such a figure is unsure whatever its interval, and says how many it needs.

The noise floor: two runs of the same thing differ by more than requests resampled within one run show
(the machine's load moves every request of a run together). With --repeat N (N >= 2) the spread of a
figure between the runs is measured (its standard deviation over runs, the noise floor), and the change's
interval is at least change +- t(0.975, df) * sd * sqrt(1/n_base + 1/n_current): the wider of the two
intervals wins.

How much more data would settle a straddling interval: its half-width shrinks about as 1/sqrt(n), so the
interval clears the limit once n grows by (half-width / distance from the change to the limit)^2."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as sps

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 20261207  # fixed: the same samples always give the same interval
MAX_FACTOR = 1000.0  # beyond this many times the data, say "not settleable by more data"
# A bootstrap cannot draw beyond a sample's largest values: a pNN interval means something only with a few
# samples beyond the percentile (p95 of 40 requests is the 2nd largest; its resamples hide the tail).
MIN_TAIL = 5


# The machine's own slowdown: when the client's ticker woke later during the current run than during the
# baseline's (CPU contention: other processes on the machine), every request waited for the CPU at each of
# its hops (client, router, engine steps) too. A latency rise up to HOPS x the rise in the ticker's p99
# lateness may be the machine's, not the engine's: the latency intervals reach down that far.
HOPS = 4
LAG_NOISE_MS = 5.0


def machine_slack_ms(base_runs: Sequence[dict[str, Any]], cur_runs: Sequence[dict[str, Any]]) -> float:
    """HOPS x how much later (p99) the client's ticker woke in the current runs than in the baseline's; 0
    when either side has no ticker samples or the current machine was no busier."""
    b = [v for r in base_runs for v in r.get("loop_lag_ms") or []]
    c = [v for r in cur_runs for v in r.get("loop_lag_ms") or []]
    if not b or not c:
        return 0.0
    pb, pc = float(np.percentile(b, 99)), float(np.percentile(c, 99))
    # the ticker's own jitter is not a busier machine: half as late again and 5 ms more, at least
    return HOPS * (pc - pb) if pc - pb > max(LAG_NOISE_MS, 0.5 * pb) else 0.0


def min_samples(q: float) -> int:
    """The fewest samples a side needs for a pq interval: MIN_TAIL of them beyond the percentile."""
    return math.ceil(MIN_TAIL / max(1 - q / 100, 1e-9) - 1e-9)

# gated figure -> how its samples are read: ("requests", column, percentile or None for the mean),
# ("windows", what each window counts)
SOURCES: dict[str, tuple[str, str, float | None]] = {
    **{f"{m}_ms.p{p}": ("requests", f"{m}_ms", float(p)) for m in ("ttft", "tpot", "e2e") for p in (50, 95, 99)},
    "throughput_tok_s": ("windows", "output_tokens", None), "requests_per_s": ("windows", "ok", None),
    "goodput_rps": ("windows", "good", None), "error_rate": ("requests", "failed", None),
    "cost_per_1k_requests": ("requests", "cost", None),
}


# ---- one run's samples -----------------------------------------------------------------------------------

def run_samples(results: Sequence[Any], warmup_s: float, window_s: float, good: Callable[[Any], bool],
                sending_s: float | None = None) -> dict[str, Any]:
    """The columns a run is judged on, JSON-ready: one entry per measured request (warm-up excluded),
    `outcome` ok / failed / cut; latencies in ms (a cut request's: its time in flight until the cut, a
    lower bound); `end_s` from the end of the warm-up; the measured window and its planned sending part."""
    measured = [r for r in results if not r.warmup]
    cols: dict[str, list[Any]] = {k: [] for k in ("outcome", "ttft_ms", "tpot_ms", "e2e_ms", "end_s",
                                                  "output_tokens", "good", "cost")}
    for r in measured:
        cut = bool(r.cancelled)
        in_flight = None if r.ended_s is None else max(r.ended_s - r.sent_s, 0.0)
        ttft = r.ttft_s if r.ttft_s is not None else (in_flight if cut else None)
        e2e = r.e2e_s if r.ok else (in_flight if cut else None)
        tpot = r.tpot_s if r.ok else None
        cols["outcome"].append("ok" if r.ok else "cut" if cut else "failed")
        cols["ttft_ms"].append(None if ttft is None else round(ttft * 1000, 3))
        cols["tpot_ms"].append(None if tpot is None else round(tpot * 1000, 4))
        cols["e2e_ms"].append(None if e2e is None else round(e2e * 1000, 3))
        cols["end_s"].append(None if r.ended_s is None else round(r.ended_s - warmup_s, 4))
        cols["output_tokens"].append(r.output_tokens if r.ok else 0)
        cols["good"].append(bool(good(r)))
        cols["cost"].append(r.cost if r.ok else None)
    return {"window_s": window_s, "sending_s": window_s if sending_s is None else sending_s, **cols}


def _rows(run: dict[str, Any], key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, end times) of one request figure's samples in one run: latencies of succeeded and cut
    requests (cut ones at their lower bound; failed ones have none), the cost of succeeded ones (None if
    any is unpriced), or the failure indicator of every request that ended (a share)."""
    _, column, _ = SOURCES[key]
    w = float(run["window_s"])
    rows = list(zip(run["outcome"], run["end_s"], run.get(column, run["outcome"]), strict=True))
    if column == "cost":
        picked = [(e, c) for o, e, c in rows if o == "ok"]
        if any(c is None for _, c in picked):
            return None
        picked = [(e, c * 1000) for e, c in picked]
    elif column == "failed":
        picked = [(e, float(o != "ok")) for o, e, _ in rows if o != "cut"]
    else:
        picked = [(e, v) for o, e, v in rows if v is not None and o != "failed"]
    ends = np.asarray([w if e is None else e for e, _ in picked], dtype=float)
    return np.asarray([v for _, v in picked], dtype=float), ends


def n_windows(seconds: float) -> int:
    """About one window a second, at least 10 (a bootstrap needs some) and at most 60."""
    return int(min(60, max(10, round(seconds))))


def _grid(run: dict[str, Any], what: str, width: float, slots: int) -> np.ndarray:
    """How much of `what` (output tokens, succeeded or good requests) ended in each `width` s slot from
    the end of the warm-up, over `slots` slots (those past the run's window hold 0)."""
    w = float(run["window_s"])
    ends = np.asarray([e if e is not None else w for e in run["end_s"]], dtype=float)
    if what == "output_tokens":
        weights = np.asarray(run["output_tokens"], dtype=float)
    elif what == "ok":
        weights = np.asarray([o == "ok" for o in run["outcome"]], dtype=float)
    else:
        weights = np.asarray(run["good"], dtype=float)
    idx = np.clip((np.clip(ends, 0.0, w) / width).astype(int), 0, slots - 1)
    return np.bincount(idx, weights=weights, minlength=slots).astype(float)


def _slot_width(runs: Sequence[dict[str, Any]]) -> float:
    sending = min(float(r.get("sending_s") or r["window_s"]) for r in runs)
    return max(sending, 1e-9) / n_windows(sending)


def _windows(run: dict[str, Any], what: str) -> np.ndarray:
    """Per time slot of the run, the rate (per second) of `what`; their mean is the run's rate."""
    width = _slot_width([run])
    slots = max(1, math.ceil(float(run["window_s"]) / width - 1e-9))
    return _grid(run, what, width, slots) / width * (slots * width / max(float(run["window_s"]), 1e-9))


def window_change(key: str, base_runs: Sequence[dict[str, Any]],
                  cur_runs: Sequence[dict[str, Any]]) -> tuple[float, float, float, float, int, int]:
    """(baseline rate, current rate, change low, change high, slots, slots) of a rate figure: the amounts
    per time slot on one grid (the same slots from each run's warm-up end, averaged over a side's runs),
    the rate their sum over the mean window. Both sides seeded alike run the same arrivals, so the slots
    are paired (slot i against slot i): the arrival schedule's own randomness, identical in both, cancels
    and what is left is how the engine answered."""
    what = SOURCES[key][1]
    runs = [*base_runs, *cur_runs]
    width = _slot_width(runs)
    slots = max(1, max(math.ceil(float(r["window_s"]) / width - 1e-9) for r in runs))
    # each side's slots averaged over its runs: the same arrivals in every run, so slot i of one side
    # faces slot i of the other whatever the number of runs; the between-run spread is the noise floor's
    b = np.mean([_grid(r, what, width, slots) for r in base_runs], axis=0)
    c = np.mean([_grid(r, what, width, slots) for r in cur_runs], axis=0)
    wb = float(np.mean([float(r["window_s"]) for r in base_runs]))
    wc = float(np.mean([float(r["window_s"]) for r in cur_runs]))
    bv, cv = float(b.sum() / wb), float(c.sum() / wc)

    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> Any:
        # a resample of n slots stands for the whole grid: scale its sum back to the window
        return np.sum(y, axis=axis) / wc - np.sum(x, axis=axis) / wb

    if (np.ptp(b) == 0 and np.ptp(c) == 0) or b.size < 2 or c.size < 2:
        return bv, cv, cv - bv, cv - bv, b.size, c.size
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = sps.bootstrap((b, c), diff, paired=True, vectorized=True, n_resamples=RESAMPLES,
                            confidence_level=CONFIDENCE, method="percentile", batch=200,
                            random_state=np.random.default_rng(SEED))
    return bv, cv, float(res.confidence_interval.low), float(res.confidence_interval.high), b.size, c.size


def samples(run: dict[str, Any], key: str) -> np.ndarray | None:
    """The samples of one figure in one run, or None when the figure has no per-sample form."""
    source = SOURCES.get(key)
    if source is None or (not run.get("outcome") and source[0] != "windows"):
        return None
    kind, column, _ = source
    if kind == "windows":
        return _windows(run, column)
    rows = _rows(run, key)
    return None if rows is None or (column == "cost" and rows[0].size == 0) else rows[0]


def _stat(key: str) -> Callable[..., Any]:
    q = SOURCES[key][2]
    if q is not None:
        return lambda x, axis=-1: np.percentile(x, q, axis=axis)
    return lambda x, axis=-1: np.mean(x, axis=axis)


def point(key: str, x: np.ndarray) -> float | None:
    return None if x.size == 0 else float(_stat(key)(x))


# ---- the comparison --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Judged:
    key: str
    baseline: float
    current: float
    change: float
    low: float  # the change's interval
    high: float
    limit: float  # the change at which the figure regresses (signed, in the bad direction)
    status: str  # regressed / ok / improved / unsure
    noise_sd: float | None  # between-run standard deviation of the figure on the baseline (None: one run)
    settle: str | None  # for unsure: what would settle it

    def as_dict(self) -> dict[str, Any]:
        return {"change_low": self.low, "change_high": self.high, "limit_change": self.limit,
                "status": self.status, "noise_sd": self.noise_sd, "settle": self.settle}


def _slotted(runs: Sequence[dict[str, Any]], key: str, width: float) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, slot of each value) over runs, each run's slots numbered after the previous run's."""
    values, slots, offset = [], [], 0
    for r in runs:
        rows = _rows(r, key)
        if rows is None:
            return None
        n = max(1, math.ceil(float(r["window_s"]) / width - 1e-9))
        values.append(rows[0])
        slots.append(offset + np.clip((np.clip(rows[1], 0, None) / width).astype(int), 0, n - 1))
        offset += n
    return np.concatenate(values), np.concatenate(slots)


def _weighted(key: str, values: np.ndarray, slot_of: np.ndarray, slot_ids: np.ndarray) -> Any:
    """The figure over the requests of resampled slots (each request counted as often as its slot was
    drawn); `slot_ids` is (..., drawn slots), the result (...)."""
    q = SOURCES[key][2]
    ids = np.asarray(slot_ids)
    top = int(slot_of.max()) + 1
    counts = (ids[..., :, None] == np.arange(top)).sum(axis=-2)  # (..., slots): how often each was drawn
    w = counts[..., slot_of].astype(float)  # (..., requests), values sorted ascending by the caller
    if q is not None:  # the inverted-CDF percentile: the first value whose cumulative weight reaches q
        cw = np.cumsum(w, axis=-1)
        idx = (cw >= (q / 100) * cw[..., -1:]).argmax(axis=-1)
        return values[idx]
    return (values * w).sum(axis=-1) / np.maximum(w.sum(axis=-1), 1e-300)


def _bootstrap_change(key: str, base_runs: Sequence[dict[str, Any]], cur_runs: Sequence[dict[str, Any]],
                      change: float) -> tuple[float, float]:
    """The change's interval, resampling time slots of requests (a block bootstrap): requests close in time
    share the machine's moment (a stall slows a cluster of them together), so slots, not single requests,
    are what vary independently; resampling single requests would understate the spread."""
    width = _slot_width([*base_runs, *cur_runs])
    b, c = _slotted(base_runs, key, width), _slotted(cur_runs, key, width)
    if b is None or c is None:
        return -math.inf, math.inf
    (bv, bslot), (cv, cslot) = b, c
    bo, co = np.argsort(bv, kind="stable"), np.argsort(cv, kind="stable")  # sorted once, not per resample
    bv, bslot, cv, cslot = bv[bo], bslot[bo], cv[co], cslot[co]
    bids, cids = np.unique(bslot), np.unique(cslot)
    if bv.size and cv.size and np.ptp(bv) == 0 and np.ptp(cv) == 0:
        return change, change  # constant samples (no errors in either run): no spread
    if bids.size < 2 or cids.size < 2:
        return -math.inf, math.inf  # nothing to resample: the change could be anything

    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> Any:
        return _weighted(key, cv, cslot, np.moveaxis(y, axis, -1)) - _weighted(key, bv, bslot,
                                                                                np.moveaxis(x, axis, -1))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples of a share are expected, not news
        res = sps.bootstrap((bids, cids), diff, paired=False, vectorized=True, n_resamples=RESAMPLES,
                            confidence_level=CONFIDENCE, method="percentile", batch=100,
                            random_state=np.random.default_rng(SEED))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return -math.inf, math.inf
    # the resampled figure is an inverted-CDF percentile, the table's numpy's linear one: the interval
    # always holds the change the table prints
    return min(lo, change), max(hi, change)


def noise(key: str, runs: Sequence[dict[str, Any]]) -> float | None:
    """The figure's standard deviation between runs (the noise floor), None with fewer than 2 runs."""
    values = [v for r in runs if (x := samples(r, key)) is not None and (v := point(key, x)) is not None]
    return float(np.std(values, ddof=1)) if len(values) >= 2 else None


def _pool(runs: Sequence[dict[str, Any]], key: str) -> np.ndarray | None:
    parts = [samples(r, key) for r in runs]
    if not parts or any(p is None for p in parts):
        return None
    return np.concatenate([p for p in parts if p is not None])


def judge(key: str, limit: Callable[[float], float], better: str, base_runs: Sequence[dict[str, Any]],
          cur_runs: Sequence[dict[str, Any]], *, improve: Callable[[float], float] | None = None,
          slack_ms: float = 0.0) -> Judged | None:
    """One gated figure: pooled point values, the change's interval (bootstrap, widened to the between-run
    noise floor), and its status against `limit(baseline)` (the signed change at which it regresses)."""
    if SOURCES[key][0] == "windows":
        if not base_runs or not cur_runs:
            return None
        bv, cv, lo, hi, size_b, size_c = window_change(key, base_runs, cur_runs)
    else:
        b, c = _pool(base_runs, key), _pool(cur_runs, key)
        if b is None or c is None or b.size == 0 or c.size == 0:
            return None
        pb, pc = point(key, b), point(key, c)
        assert pb is not None and pc is not None
        bv, cv, size_b, size_c = pb, pc, b.size, c.size
        lo, hi = _bootstrap_change(key, base_runs, cur_runs, pc - pb)
    change = cv - bv
    if slack_ms and SOURCES[key][1].endswith("_ms"):  # a busier machine may explain this much of a rise
        lo -= slack_ms
    sd_b = noise(key, base_runs)
    sd_c = noise(key, cur_runs)
    nb, nc = len(base_runs), len(cur_runs)
    if sd_b is not None:
        # pooled between-run spread when the current run was repeated too; else the baseline's alone
        if sd_c is not None:
            sd, df = math.sqrt(((nb - 1) * sd_b ** 2 + (nc - 1) * sd_c ** 2) / (nb + nc - 2)), nb + nc - 2
        else:
            sd, df = sd_b, nb - 1
        hw = float(sps.t.ppf(0.5 + CONFIDENCE / 2, df)) * sd * math.sqrt(1 / nb + 1 / nc)
        lo, hi = min(lo, change - hw), max(hi, change + hw)
        noise_dominates = hw >= max(change - lo, hi - change) - 1e-12
    else:
        noise_dominates = False
    lim = limit(bv)
    bad_up = better == "lower"  # the bad direction: up for latency, errors, cost; down for rates
    past = lo > lim if bad_up else hi < lim
    inside = hi <= lim if bad_up else lo >= lim
    gain = improve(bv) if improve is not None else -lim
    improved = (hi < gain) if bad_up else (lo > gain)
    status = "regressed" if past else "improved" if improved else "ok" if inside else "unsure"
    settle = None
    q = SOURCES[key][2]
    if q is not None and min(size_b, size_c) < min_samples(q):  # the interval itself is not to be trusted
        need = min_samples(q)
        short = "baseline" if size_b < size_c else "current run"
        return Judged(key, bv, cv, change, lo, hi, lim, "unsure", sd_b,
                      f"not judged yet: a p{q:g} needs at least {need:,} samples a side ({MIN_TAIL} beyond it) before "
                      "its interval "
                      f"means anything: about {need - min(size_b, size_c):,} more requests in the {short} would "
                      f"settle that (this comparison has {size_b:,} and {size_c:,})")
    if status == "unsure":
        seconds = sum(float(r["window_s"]) for r in cur_runs) / nc
        settle = _settle(change, lo, hi, lim, noise_dominates, SOURCES[key][0], size_b, size_c, max(nb, nc), seconds)
    return Judged(key, bv, cv, change, lo, hi, lim, status, sd_b, settle)


def settle_factor(change: float, low: float, high: float, limit: float) -> float | None:
    """How many times the data would make an interval [low, high] around `change` clear `limit`, assuming
    its half-width shrinks as 1/sqrt(n): (half-width on the limit's side / distance to the limit)^2. None
    when the change sits on the limit (no amount of data settles it) or the interval is unbounded."""
    half = (high - change) if limit >= change else (change - low)
    distance = abs(limit - change)
    if not math.isfinite(half) or distance <= 0:
        return None
    factor = (half / distance) ** 2
    return factor if factor <= MAX_FACTOR else None


def _settle(change: float, low: float, high: float, limit: float, by_repeats: bool, kind: str, n_base: int,
            n_cur: int, runs: int, seconds: float) -> str:
    """What would settle a straddling interval, in the unit that narrows it: runs when the between-run
    spread sets its width, measured seconds for a rate, requests for a percentile, mean or share."""
    return "it straddles the limit; " + _more(change, low, high, limit, by_repeats, kind, n_base, n_cur, runs, seconds)


def _more(change: float, low: float, high: float, limit: float, by_repeats: bool, kind: str, n_base: int,
          n_cur: int, runs: int, seconds: float) -> str:
    factor = settle_factor(change, low, high, limit)
    if factor is None:
        return (f"the change is too close to the limit: no feasible amount of data would settle it (over "
                f"{MAX_FACTOR:,.0f}x this run's); decide on the limit, or take the point change as it is")
    if by_repeats:  # the between-run spread sets the width: more runs narrow it, longer runs do not
        need = max(math.ceil(factor * runs), runs + 1)
        return f"about {need} runs on each side (--repeat {need}) would settle it"
    if kind == "windows":
        return (f"about {math.ceil(factor * seconds):,} measured seconds per run on each side ({factor:.1f}x "
                f"this run's {seconds:,.0f} s) would settle it")
    more = math.ceil(factor * max(n_base, n_cur))
    return f"about {more:,} requests on each side ({factor:.1f}x this run's {n_cur:,}) would settle it"
