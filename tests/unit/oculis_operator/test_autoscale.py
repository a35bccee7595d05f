"""The desired-replica computation: every branch of autoscale.decide, as a table."""

from __future__ import annotations

import pytest

from oculis_operator.autoscale import (
    STALE_AFTER_S,
    Decision,
    Policy,
    Sample,
    State,
    decide,
    demand_from,
    placeable_replicas,
    sample_from,
    state_from_status,
    to_status,
)

NOW = 10_000.0
P = Policy(min_replicas=1, max_replicas=4, waiting_per_replica=5, kv_cache_usage=0.8,
           scale_up_stabilization_s=30, scale_down_delay_s=60, scale_to_zero_after_s=120)
P0 = Policy(**{**P.__dict__, "min_replicas": 0})


def s(pods: int = 1, waiting: float = 0, running: float = 0, kv: float = 0.0, age: float = 1) -> Sample:
    return Sample(pods=pods, waiting=waiting, running=running, kv_usage=kv, newest_at=NOW - age)


CASES: list[tuple[str, Policy, int, int, Sample | None, float | None, State, int, int, str]] = [
    # name, policy, current, ready, sample, demand, state, placeable, expected desired, expected reason
    ("burst waits for the up window", P, 1, 1, s(waiting=20, running=8, kv=0.9), 30, State(), 8, 1, "StabilizingUp"),
    ("burst after the up window scales to the lowest reading", P, 1, 1, s(waiting=20, running=8, kv=0.9), 30,
     State(above_since=NOW - 30, up_target=3), 8, 3, "ScaleUp"),
    ("up capped by maxReplicas", P, 1, 1, s(waiting=100, running=8, kv=1.0), 30, State(above_since=NOW - 31),
     8, 4, "ScaleUp"),
    ("up capped by the GPUs the pool can place", P, 1, 1, s(waiting=20, kv=0.9), 30, State(above_since=NOW - 31),
     2, 2, "WaitingForGPUs"),
    ("no free GPU at all holds the count", P, 1, 1, s(waiting=20, kv=0.9), 30, State(above_since=NOW - 31),
     1, 1, "WaitingForGPUs"),
    ("not-ready replicas hold a further scale-up", P, 3, 1, s(pods=1, waiting=40, kv=1.0), 30, State(), 8, 3,
     "WaitingForReady"),
    ("quiet waits for the down delay", P, 3, 3, s(pods=3, running=1, kv=0.1), 1, State(), 8, 3, "StabilizingDown"),
    ("down after the delay to the highest reading", P, 3, 3, s(pods=3, running=1, kv=0.1), 1,
     State(below_since=NOW - 60, down_target=2), 8, 2, "ScaleDown"),
    ("steady load keeps the count", P, 2, 2, s(pods=2, running=4, kv=0.7), 4, State(), 8, 2, "Steady"),
    ("missing metrics hold and never scale down", P, 3, 3, None, 0, State(below_since=NOW - 600), 8, 3,
     "MetricsMissing"),
    ("stale metrics hold", P, 3, 3, s(pods=3, age=STALE_AFTER_S + 1), 0, State(below_since=NOW - 600), 8, 3,
     "MetricsStale"),
    ("partial metrics hold", P, 3, 3, s(pods=2), 0, State(below_since=NOW - 600), 8, 3, "MetricsPartial"),
    ("idle with minReplicas 1 stays at 1", P, 2, 2, s(pods=2), 0, State(below_since=NOW - 60, idle_since=NOW - 900),
     8, 1, "ScaleDown"),
    ("idle to zero after scaleToZeroAfter", P0, 1, 1, s(), 0, State(idle_since=NOW - 120), 8, 0, "ScaledToZero"),
    ("idle but not long enough stays at 1", P0, 1, 1, s(), 0, State(idle_since=NOW - 60), 8, 1, "Steady"),
    ("unknown router demand is not idleness", P0, 1, 1, s(), None, State(idle_since=NOW - 900), 8, 1, "Steady"),
    ("demand wakes an upstream at zero at once", P0, 0, 0, None, 1, State(), 8, 1, "WakeUp"),
    ("wake with no free GPU reports the pool", P0, 0, 0, None, 1, State(), 0, 0, "WaitingForGPUs"),
    ("no demand at zero stays at zero", P0, 0, 0, None, 0, State(), 8, 0, "ScaledToZero"),
    ("unknown demand at zero stays at zero", P0, 0, 0, None, None, State(), 8, 0, "DemandUnknown"),
    ("zero below minReplicas comes back", P, 0, 0, None, 0, State(), 8, 1, "BelowMinimum"),
    ("above maxReplicas (spec edited) comes down", P, 6, 6, s(pods=6), 0, State(), 8, 4, "OutOfBounds"),
    ("below minReplicas comes up", Policy(**{**P.__dict__, "min_replicas": 3}), 1, 1, s(), 0, State(), 8, 3,
     "OutOfBounds"),
    ("below minReplicas only to what the pool places", Policy(**{**P.__dict__, "min_replicas": 3}), 1, 1, s(), 0,
     State(), 2, 2, "WaitingForGPUs"),
    ("below minReplicas without metrics still only what the pool places", Policy(**{**P.__dict__,
     "min_replicas": 3}), 1, 0, None, 0, State(), 2, 2, "WaitingForGPUs"),
]


@pytest.mark.parametrize(("name", "policy", "current", "ready", "sample", "demand", "state", "placeable", "want",
                          "reason"), CASES, ids=[c[0] for c in CASES])
def test_autoscale_decision_table(name: str, policy: Policy, current: int, ready: int, sample: Sample | None,
                                  demand: float | None, state: State, placeable: int, want: int,
                                  reason: str) -> None:
    d = decide(policy, current, ready, sample, demand, state, NOW, placeable, pool="H100-80GB")
    assert (d.desired, d.reason) == (want, reason), d.message
    missing = (sample is None and current > 0) or reason in ("MetricsStale", "MetricsPartial", "DemandUnknown")
    assert d.metrics_ok == (not missing)


def test_scrape_gap_restarts_the_scale_down_window() -> None:
    """A gap mid-window must not let the next good reading scale down at once (no flap)."""
    quiet = s(pods=3, running=1, kv=0.1)
    first = decide(P, 3, 3, quiet, 1, State(), NOW - 50, 8)
    assert first.reason == "StabilizingDown"
    gap = decide(P, 3, 3, None, 1, first.state, NOW - 20, 8)
    assert (gap.desired, gap.state.below_since) == (3, None)
    after = decide(P, 3, 3, quiet, 1, gap.state, NOW + 15, 8)
    assert (after.desired, after.reason) == (3, "StabilizingDown")


def test_a_one_scrape_spike_does_not_scale_up() -> None:
    spike = decide(P, 1, 1, s(waiting=20, kv=0.9), 30, State(), NOW - 40, 8)
    calm = decide(P, 1, 1, s(running=1, kv=0.2), 1, spike.state, NOW - 5, 8)
    assert calm.state.above_since is None
    assert decide(P, 1, 1, s(running=1, kv=0.2), 1, calm.state, NOW, 8).desired == 1


def test_wait_for_gpus_names_the_pool_and_the_shortfall() -> None:
    d = decide(P, 1, 1, s(waiting=20, kv=0.9), 30, State(above_since=NOW - 31), NOW, 2, pool="H100-80GB")
    assert (d.shortfall, d.desired) == (2, 2)
    assert "H100-80GB" in d.message and "2 short" in d.message
    # The next evaluation asks again at once (the up window stays open), in the same words: the shell
    # reports it once, not once per evaluation.
    again = decide(P, 2, 2, s(pods=2, waiting=21, kv=0.95), 30, d.state, NOW + 10, 2, pool="H100-80GB")
    assert again.reason == "WaitingForGPUs"
    assert again.message.split("; ")[-1] == d.message.split("; ")[-1]


def test_the_shortfall_event_keeps_its_words_while_the_pool_frees_gpus() -> None:
    # Another tenant's pods (a namespace still terminating) leave the pool: the condition's figures move,
    # the Event's words do not, so the one shortfall is posted once.
    P3 = Policy(**{**P.__dict__, "min_replicas": 3})
    busy = decide(P3, 0, 0, None, None, State(), NOW, 1, pool="H100-80GB")
    freed = decide(P3, 1, 0, None, None, busy.state, NOW + 3, 2, pool="H100-80GB")
    assert (busy.reason, freed.reason) == ("WaitingForGPUs", "WaitingForGPUs")
    assert "2 short" in busy.wait and "1 short" in freed.wait
    assert busy.wait_event == freed.wait_event and "H100-80GB pool" in busy.wait_event


def test_placeable_counts_free_gpu_sets_per_node() -> None:
    def node(name: str, gpus: int, product: str = "NVIDIA-H100-80GB-HBM3", unschedulable: bool = False) -> dict:
        return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
                "spec": {"unschedulable": unschedulable}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}

    def pod(node_name: str, gpus: int, phase: str = "Running") -> dict:
        return {"spec": {"nodeName": node_name, "containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
                "status": {"phase": phase}}

    nodes = [node("a", 8), node("b", 3), node("c", 8, unschedulable=True), node("d", 8, product="other")]
    pods = [pod("a", 2), pod("a", 2), pod("b", 1), pod("b", 2, phase="Succeeded")]
    # a: 4 free -> 2 sets of 2; b: 2 free -> 1 set; c cordoned; d another product
    assert placeable_replicas(nodes, pods, "NVIDIA-H100-80GB-HBM3", 2, scheduled=2) == 5


def _vec(*rows: tuple[str, float, float]) -> list[dict]:
    return [{"metric": {"pod": p}, "value": [ts, str(v)]} for p, ts, v in rows]


def test_sample_from_sums_pods_with_every_series_and_is_none_when_one_is_missing() -> None:
    data = {"vllm:num_requests_waiting": _vec(("u-vllm-a", 100, 3), ("u-vllm-b", 101, 1)),
            "vllm:num_requests_running": _vec(("u-vllm-a", 100, 4), ("u-vllm-b", 101, 2)),
            "vllm:kv_cache_usage_perc": _vec(("u-vllm-a", 100, 0.5), ("u-vllm-b", 99, 0.3))}
    got = sample_from(lambda q: data[q.split("{")[0]], "ns", "u")
    assert got == Sample(pods=2, waiting=4, running=6, kv_usage=0.4, newest_at=100)
    partial = {**data, "vllm:kv_cache_usage_perc": _vec(("u-vllm-a", 100, 0.5))}
    assert sample_from(lambda q: partial[q.split("{")[0]], "ns", "u").pods == 1  # type: ignore[union-attr]
    assert sample_from(lambda q: None if "kv" in q else data[q.split("{")[0]], "ns", "u") is None


def test_demand_unknown_differs_from_zero() -> None:
    assert demand_from(lambda q: None, "ns", "u", 60) is None
    assert demand_from(lambda q: [], "ns", "u", 60) == 0.0
    assert demand_from(lambda q: [{"metric": {}, "value": [1, "7"]}], "ns", "u", 60) == 7.0


def test_state_survives_the_status_round_trip() -> None:
    st = State(above_since=1_700_000_000.0, up_target=3, below_since=None, down_target=None,
               idle_since=1_700_000_100.0)
    out = to_status(Decision(2, "StabilizingUp", "m", st, True))
    assert out["desiredReplicas"] == 2 and state_from_status(out) == st
    assert state_from_status(None) == State()
