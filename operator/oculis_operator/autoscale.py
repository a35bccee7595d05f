"""Desired engine replicas of an autoscaled GPUUpstream. Pure: no API calls, no clock.

Inputs: what vLLM's own metrics say (`vllm:num_requests_waiting`, `vllm:num_requests_running`,
`vllm:kv_cache_usage_perc`, summed/averaged over the upstream's engine pods by the shell), the router's
demand for the upstream (requests in flight or arriving, including those held or escalated while it is
at zero), the stabilisation state carried in status.autoscaling, and how many replicas the GPU pool can
place right now. Output: the replicas to ask for, a reason, a message with the figures, the new state.

Rules, and why:
- Missing, stale or partial metrics never scale down: a scrape gap reads as "no data", not as "no
  load" (AIBrix and others scaled down on fetch errors). They hold the count, set ScalingActive=False,
  and restart the scale-down window, so a gap can never shorten it (no flap after the gap).
- Up after `scaleUpStabilization` of readings above the current count, to the lowest of those
  readings (a one-scrape spike does not buy GPUs), at most `maxScaleUpStep` replicas at a time (the
  next step waits for those to be Ready, so the load they take is seen first); down only after
  `scaleDownDelay` of readings below, to the highest of those readings.
- Waking from zero is immediate on router demand: a request is waiting (or being escalated) now.
- To zero only with minReplicas 0, after `scaleToZeroAfter` with no queue, nothing running and no
  router demand; an unknown router demand is not idleness.
- Never more than the pool can place now: the shortfall is reported (WaitingForGPUs) naming the pool.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from oculis import gpus
from oculis.autoscaling import Autoscaling
from oculis.formats import duration_or_zero_seconds, duration_seconds

# A sample older than this (seconds) is stale: Prometheus stopped scraping or the engines stopped answering.
STALE_AFTER_S = 60.0


@dataclass(frozen=True)
class Policy:
    """spec.autoscaling, in seconds."""

    min_replicas: int = 1
    max_replicas: int = 1
    waiting_per_replica: float = 5.0
    kv_cache_usage: float = 0.8
    scale_up_stabilization_s: float = 0.0
    scale_down_delay_s: float = 300.0
    scale_to_zero_after_s: float = 600.0
    max_scale_up_step: int | None = None  # None: no limit beyond maxReplicas and the pool

    @classmethod
    def of(cls, auto: Autoscaling) -> Policy:
        """The policy of a validated spec.autoscaling (durations in seconds)."""
        return cls(min_replicas=auto.min_replicas, max_replicas=auto.max_replicas,
                   waiting_per_replica=auto.targets.waiting_per_replica, kv_cache_usage=auto.targets.kv_cache_usage,
                   scale_up_stabilization_s=duration_or_zero_seconds(auto.scale_up_stabilization),
                   scale_down_delay_s=duration_or_zero_seconds(auto.scale_down_delay),
                   scale_to_zero_after_s=duration_seconds(auto.scale_to_zero_after),
                   max_scale_up_step=auto.max_scale_up_step)


@dataclass(frozen=True)
class Sample:
    """The engines' metrics for one upstream at one instant, as the shell read them."""

    pods: int  # engine pods with all three series
    waiting: float  # sum of vllm:num_requests_waiting
    running: float  # sum of vllm:num_requests_running
    kv_usage: float  # mean of vllm:kv_cache_usage_perc (0..1)
    newest_at: float  # timestamp (epoch s) of the newest sample


@dataclass(frozen=True)
class State:
    """Stabilisation state, kept in status.autoscaling between evaluations (epoch seconds)."""

    above_since: float | None = None
    up_target: int | None = None  # lowest recommendation since above_since
    below_since: float | None = None
    down_target: int | None = None  # highest recommendation since below_since
    idle_since: float | None = None


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str
    message: str
    state: State
    metrics_ok: bool  # ScalingActive: the figures were complete and fresh
    shortfall: int = 0  # replicas wanted beyond what the pool can place now
    wait: str = ""  # the shortfall with its figures (gpu_wait_text), for the Progressing condition
    # The shortfall in words that do not move while it lasts (gpu_wait_event): the one Event it gets.
    wait_event: str = ""


def recommend(policy: Policy, sample: Sample, demand: float | None) -> int:
    """Replicas the load asks for, before stabilisation and bounds: the larger of queue and KV pressure
    (each against its per-replica target, HPA style) and at least one while anything runs or waits."""
    # Both are HPA AverageValue-style: the total over the pods divided by what one replica should carry.
    by_queue = math.ceil(sample.waiting / policy.waiting_per_replica - 1e-9)
    by_kv = math.ceil(sample.pods * sample.kv_usage / policy.kv_cache_usage - 1e-9)
    busy = sample.waiting > 0 or sample.running > 0 or (demand or 0) > 0
    return max(by_queue, by_kv, 1 if busy else 0)


def decide(policy: Policy, current: int, ready: int, sample: Sample | None, demand: float | None,
           state: State, now: float, placeable: int, pool: str = "") -> Decision:
    """`current`: the Deployment's replicas; `ready`: those Ready; `sample`: None when Prometheus gave
    nothing; `demand`: router requests for the upstream in the window, None when unknown; `placeable`:
    the most replicas the pool's free GPUs (plus those already running) can hold now."""
    lo, hi = policy.min_replicas, max(policy.max_replicas, policy.min_replicas)
    floor = max(lo, 0)
    # Wake from zero on demand, whatever the engine metrics (at zero there are no engines to report).
    if current == 0:
        if demand is not None and demand > 0:
            return _bounded(max(1, floor), "WakeUp", f"router demand {demand:g} for an upstream at zero",
                            State(), True, placeable, pool, current)
        if floor > 0:
            return _bounded(floor, "BelowMinimum", f"minReplicas is {floor}", State(), True, placeable, pool, current)
        ok = demand is not None
        return Decision(0, "ScaledToZero" if ok else "DemandUnknown",
                        "idle: no router demand" if ok else "router demand unknown: staying at zero until it reads",
                        State(), ok)
    problem = _metrics_problem(sample, ready, now)
    if problem is not None:
        # Hold, and restart the down window: a gap must never shorten it.
        held = min(max(current, floor), hi)
        kept = replace(state, below_since=None, down_target=None, idle_since=None)
        if held > current:  # up to minReplicas needs no metrics, but still only what the pool can place
            return _bounded(held, problem[0], f"{problem[1]}; raising to minReplicas {held}", kept, False, placeable,
                            pool, current)
        return Decision(held, problem[0], f"{problem[1]}; holding {held} replicas (never scaling down on missing "
                        "data)", kept, False)
    assert sample is not None
    if current < floor or current > hi:
        target = min(max(current, floor), hi)
        return _bounded(target, "OutOfBounds", f"replicas {current} outside [{floor}, {hi}]", State(), True,
                        placeable, pool, current)
    raw = recommend(policy, sample, demand)
    figures = (f"waiting {sample.waiting:g}, running {sample.running:g}, KV usage {sample.kv_usage:.0%} over "
               f"{sample.pods} pods, router demand " + ("unknown" if demand is None else f"{demand:g}"))
    idle = sample.waiting == 0 and sample.running == 0 and demand is not None and demand == 0
    idle_since = (state.idle_since if state.idle_since is not None else now) if idle else None
    if raw == 0 and floor == 0 and idle_since is not None and now - idle_since >= policy.scale_to_zero_after_s:
        return Decision(0, "ScaledToZero", f"idle for {now - idle_since:g} s (scaleToZeroAfter "
                        f"{policy.scale_to_zero_after_s:g} s): {figures}", State(), True)
    raw = min(max(raw, floor, 1), hi)  # to zero only via the idle rule above
    if raw > current:
        if ready < current:  # replicas still starting: their load is not visible yet, wait for them
            return Decision(current, "WaitingForReady", f"{ready}/{current} ready; {figures}",
                            replace(state, below_since=None, down_target=None, idle_since=idle_since), True)
        since = state.above_since if state.above_since is not None else now
        target = min(raw, state.up_target) if state.up_target is not None else raw
        new = State(above_since=since, up_target=target, idle_since=idle_since)
        if now - since >= policy.scale_up_stabilization_s:
            step = policy.max_scale_up_step
            if step is not None and target > current + step:
                # A partial step keeps the up window open: once these are Ready the next step needs no new wait.
                return _bounded(current + step, "ScaleUp", f"{figures} ask for {target}; adding {step} now "
                                f"(maxScaleUpStep {step})", new, True, placeable, pool, current, capped_state=new)
            return _bounded(target, "ScaleUp", f"{figures} ask for {target}", State(idle_since=idle_since), True,
                            placeable, pool, current, capped_state=new)
        return Decision(current, "StabilizingUp", f"{figures} ask for {raw}; up after "
                        f"{policy.scale_up_stabilization_s:g} s above", new, True)
    if raw < current:
        since = state.below_since if state.below_since is not None else now
        target = max(raw, state.down_target) if state.down_target is not None else raw
        if now - since >= policy.scale_down_delay_s:
            return Decision(target, "ScaleDown", f"{figures} ask for {target} for {now - since:g} s",
                            State(idle_since=idle_since), True)
        return Decision(current, "StabilizingDown", f"{figures} ask for {raw}; down after "
                        f"{policy.scale_down_delay_s:g} s below",
                        State(below_since=since, down_target=target, idle_since=idle_since), True)
    return _bounded(current, "Steady", f"{figures} ask for {raw}", State(idle_since=idle_since), True, placeable,
                    pool, current)


def _bounded(target: int, reason: str, message: str, state: State, ok: bool, placeable: int, pool: str,
             current: int, capped_state: State | None = None) -> Decision:
    """Never ask for more than the pool can place now (but never below what already runs). Capped, the
    up window stays open (`capped_state`), so the next evaluation asks again without a new wait."""
    cap = max(placeable, min(current, target))
    if target <= cap:
        return Decision(target, reason, message, state, ok)
    short = target - cap
    wait = gpu_wait_text(pool, target, cap)
    return Decision(cap, "WaitingForGPUs", f"{message}; {wait}", capped_state or state, ok, shortfall=short,
                    wait=wait, wait_event=gpu_wait_event(pool, target))


def gpu_wait_text(pool: str, target: int, cap: int) -> str:
    """The shortfall with what the pool can place now (the condition: it may move while the shortfall lasts)."""
    return (f"wants {target} replicas but the {pool or 'GPU'} pool can place {cap} now, {target - cap} short: "
            "waiting for free GPUs of that product (add nodes or free GPUs)")


def gpu_wait_event(pool: str, target: int) -> str:
    """The shortfall in words that do not change while it lasts, so its Event is posted once, not per
    evaluation: what the pool can place moves with other tenants' pods (a namespace still terminating
    frees its GPUs a few seconds later), which is no new shortfall."""
    return (f"wants {target} replicas but the {pool or 'GPU'} pool cannot place them all now: waiting for free "
            "GPUs of that product (add nodes or free GPUs; the Progressing condition says how many are short)")


def _metrics_problem(sample: Sample | None, ready: int, now: float) -> tuple[str, str] | None:
    if sample is None:
        return "MetricsMissing", "no engine metrics from Prometheus"
    if now - sample.newest_at > STALE_AFTER_S:
        return "MetricsStale", f"newest engine sample is {now - sample.newest_at:.0f} s old"
    if sample.pods < ready:
        return "MetricsPartial", f"metrics from {sample.pods} of {ready} ready pods"
    return None


def placeable_replicas(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], gfd_product: str,
                       gpus_per_replica: int, scheduled: int) -> int:
    """Replicas that can run now: this upstream's pods already on a node (`scheduled`; a Pending one
    holds no GPU) plus what the free GPUs of each schedulable node of the product hold (a replica's
    GPUs are on one node)."""
    used: dict[str, int] = {}
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod.get("spec", {}).get("containers", []):
            res = c.get("resources") or {}
            used[node] = used.get(node, 0) + int((res.get("requests") or res.get("limits") or {}).get(
                gpus.GPU_RESOURCE, 0))
    free = 0
    for node in nodes:
        meta = node.get("metadata", {})
        if meta.get("labels", {}).get(gpus.GPU_PRODUCT_LABEL) != gfd_product or node.get("spec", {}).get(
                "unschedulable"):
            continue
        alloc = int(node.get("status", {}).get("allocatable", {}).get(gpus.GPU_RESOURCE, 0))
        free += max(0, alloc - used.get(meta.get("name", ""), 0)) // max(1, gpus_per_replica)
    return scheduled + free


def sample_from(query: Callable[[str], list[dict[str, Any]] | None], namespace: str, name: str) -> Sample | None:
    """Read the three vLLM series of the upstream's engine pods through `query` (a PromQL instant query
    returning the result vector, None on failure). None when any series is missing entirely."""
    sel = f'{{namespace="{namespace}",pod=~"{name}-vllm-.+"}}'
    series: dict[str, dict[str, tuple[float, float]]] = {}
    for metric in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        result = query(metric + sel)
        if not result:
            return None
        per_pod: dict[str, tuple[float, float]] = {}
        for r in result:
            try:
                ts, value = float(r["value"][0]), float(r["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if value == value:  # NaN is no reading
                pod = str(r.get("metric", {}).get("pod", ""))
                per_pod[pod] = max(per_pod.get(pod, (0.0, 0.0)), (ts, value)) if pod in per_pod else (ts, value)
        series[metric] = per_pod
    pods = set.intersection(*(set(v) for v in series.values()))
    if not pods:
        return None
    w, r_, kv = (series[m] for m in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                                      "vllm:kv_cache_usage_perc"))
    return Sample(pods=len(pods), waiting=sum(w[p][1] for p in pods), running=sum(r_[p][1] for p in pods),
                  kv_usage=sum(kv[p][1] for p in pods) / len(pods),
                  newest_at=min(max(s[p][0] for s in (w, r_, kv)) for p in pods))


def demand_from(query: Callable[[str], list[dict[str, Any]] | None], namespace: str, name: str,
                window_s: float) -> float | None:
    """Router requests for the upstream over the window (`oculis_upstream_demand_total`, which counts
    held and escalated requests too); None when Prometheus gave nothing (unknown, not zero). A router
    scraped in-cluster carries its namespace; one scraped outside (a local `oculis serve`) has none."""
    result = query(f'sum(increase(oculis_upstream_demand_total{{namespace=~"{namespace}|",'
                   f'upstream="{name}"}}[{int(window_s)}s]))')
    if result is None:
        return None
    if not result:
        return 0.0  # the query ran: no router counted a request for this upstream
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return None if value != value else value


def _iso(t: float | None) -> str | None:
    return None if t is None else datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None


def state_from_status(status: dict[str, Any] | None) -> State:
    s = status or {}
    up, down = s.get("upTarget"), s.get("downTarget")
    return State(above_since=_epoch(s.get("aboveSince")), up_target=up if isinstance(up, int) else None,
                 below_since=_epoch(s.get("belowSince")), down_target=down if isinstance(down, int) else None,
                 idle_since=_epoch(s.get("idleSince")))


def to_status(decision: Decision) -> dict[str, Any]:
    """status.autoscaling: the decision and the state the next evaluation starts from."""
    st = decision.state
    return {"desiredReplicas": decision.desired, "reason": decision.reason, "message": decision.message[:1000],
            "aboveSince": _iso(st.above_since), "upTarget": st.up_target, "belowSince": _iso(st.below_since),
            "downTarget": st.down_target, "idleSince": _iso(st.idle_since)}
