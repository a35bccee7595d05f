"""The classifier-drift verdict: every branch of classifier_drift.assess, as a table."""

from __future__ import annotations

import pytest

from oculis_operator.classifier_drift import DriftPolicy, Window, assess, window_from

BASE = Window(3600, {"small": 800, "large": 200}, escalations=50)  # 20 % large, 5 % escalated
POL = DriftPolicy(factor=2.0, min_requests=20, floor=0.02)

CASES = [
    ("same mix", Window(60, {"small": 40, "large": 10}, 3), "False", "WithinBaseline"),
    ("escalation rate doubled", Window(60, {"small": 40, "large": 10}, 6), "True", "ShiftedBeyondFactor"),
    ("a tier's share more than doubled", Window(60, {"small": 25, "large": 25}, 2), "True", "ShiftedBeyondFactor"),
    ("a tier's share fell below half", Window(60, {"small": 48, "large": 2}, 2), "True", "ShiftedBeyondFactor"),
    ("a new tier appears", Window(60, {"small": 30, "large": 10, "xl": 10}, 2), "True", "ShiftedBeyondFactor"),
    ("too few requests", Window(60, {"small": 5, "large": 10}, 9), "Unknown", "TooFewRequests"),
]


@pytest.mark.parametrize(("name", "short", "status", "reason"), CASES, ids=[c[0] for c in CASES])
def test_classifier_drift_table(name: str, short: Window, status: str, reason: str) -> None:
    v = assess(short, BASE, POL)
    assert (v.status, v.reason) == (status, reason), v.message
    assert v.traffic["window"] == "1m" and v.traffic["baseline"]["window"] == "1h"


def test_drift_message_carries_both_figures() -> None:
    v = assess(Window(60, {"small": 40, "large": 10}, 6), BASE, POL)
    assert "escalation rate 12.0% vs 5.0% baseline" in v.message
    assert v.traffic["escalationRate"] == 0.12 and v.traffic["tierShares"] == {"large": 0.2, "small": 0.8}


def test_no_baseline_is_unknown_not_false() -> None:
    v = assess(Window(60, {"small": 50}, 0), Window(3600, {"small": 3}, 0), POL)
    assert (v.status, v.reason) == ("Unknown", "NoBaseline")


def test_a_rate_from_zero_needs_the_floor() -> None:
    """From a 0 % baseline, 1 of 50 escalated is noise (below factor x floor); 5 of 50 is drift."""
    base = Window(3600, {"small": 1000}, 0)
    assert assess(Window(60, {"small": 50}, 1), base, POL).status == "False"
    assert assess(Window(60, {"small": 50}, 5), base, POL).status == "True"


def test_window_from_reads_tiers_and_escalations() -> None:
    def query(q: str) -> list[dict] | None:
        if "escalations" in q:
            return [{"metric": {}, "value": [0, "4"]}]
        return [{"metric": {"tier": "small"}, "value": [0, "30"]}, {"metric": {"tier": "large"}, "value": [0, "10"]}]

    w = window_from(query, "ns", "chat", 60)
    assert w == Window(60, {"small": 30.0, "large": 10.0}, 4.0)
    assert window_from(lambda q: None, "ns", "chat", 60) is None


def test_evaluate_compares_the_short_window_with_the_long_one_just_before_it() -> None:
    from oculis_operator.classifier_drift import evaluate, window_seconds

    asked: list[str] = []

    def query(q: str) -> list[dict] | None:
        asked.append(q)
        baseline = "offset" in q
        if "escalations" in q:
            return [{"metric": {}, "value": [0, "50" if baseline else "20"]}]
        return [{"metric": {"tier": "small"}, "value": [0, "800" if baseline else "40"]},
                {"metric": {"tier": "large"}, "value": [0, "200" if baseline else "10"]}]

    v = evaluate(query, "ns", "chat", window_seconds("1m"), window_seconds("1d"), DriftPolicy())
    assert v is not None and v.status == "True" and "escalation rate 40.0% vs 5.0%" in v.message
    assert any("[86400s] offset 60s" in q for q in asked) and any("[60s])" in q for q in asked)
    assert evaluate(lambda q: None, "ns", "chat", 60, 86400, DriftPolicy()) is None


def test_the_drift_alarm_stays_out_of_the_router_config() -> None:
    from oculis_operator.routeconfig import render_namespace

    up = {"metadata": {"name": "gpt", "namespace": "ns", "generation": 1},
          "spec": {"provider": "openai", "model": "gpt-4o"},
          "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "NoCredentials"}]}}
    route = {"metadata": {"name": "chat", "namespace": "ns", "generation": 1},
             "spec": {"tiers": [{"name": "only", "upstream": "gpt", "match": {}}],
                      "classifierDrift": {"shortWindow": "1m", "longWindow": "1h", "factor": 2}}}
    out = render_namespace([route], [up])
    assert out.routes["chat"].ready, out.routes["chat"].message
    assert "classifier_drift" not in out.data["oculis-config.yaml"] and "classifierDrift" not in str(out.data)
