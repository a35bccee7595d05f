"""The speculative-decoding guard: a whole window below the threshold with enough draft tokens turns
speculation off; hysteresis never flaps; too little data decides nothing."""

from __future__ import annotations

from oculis_operator import speculative
from oculis_operator.speculative import Sample, decide

T0, T30, T60 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:30Z", "2026-01-01T00:01:00Z"
LOW = Sample(draft_tokens=1000, accepted_tokens=300, drafts=250)  # 0.3
HIGH = Sample(draft_tokens=1000, accepted_tokens=800, drafts=250)  # 0.8


def test_rates_and_mean_accepted_length() -> None:
    assert speculative.rates(HIGH) == (0.8, 1 + 800 / 250)
    assert speculative.rates(Sample(draft_tokens=0, accepted_tokens=0)) == (None, None)
    assert speculative.rates(None) == (None, None)


def test_good_acceptance_is_kept() -> None:
    v = decide(0.5, True, HIGH, 60, None, T0)
    assert v.decision == "Keep" and v.acceptance_rate == 0.8 and v.low_since is None


def test_low_acceptance_for_a_whole_window_disables() -> None:
    first = decide(0.5, True, LOW, 60, None, T0)
    assert first.decision == "Watching" and first.low_since == T0
    assert decide(0.5, True, LOW, 60, first.low_since, T30).decision == "Watching"
    off = decide(0.5, True, LOW, 60, first.low_since, T60)
    assert off.decision == "Disable" and "acceptance 0.300" in off.message and "threshold 0.5" in off.message


def test_without_auto_disable_low_acceptance_is_only_reported() -> None:
    v = decide(0.5, False, LOW, 60, T0, T60)
    assert v.decision == "Watching" and "autoDisable is off" in v.message


def test_hysteresis_keeps_watching_until_clearly_above() -> None:
    just_above = Sample(draft_tokens=1000, accepted_tokens=520)
    v = decide(0.5, True, just_above, 60, T0, T30)
    assert v.decision == "Watching" and v.low_since == T0  # the dip is not forgotten at 0.52
    cleared = decide(0.5, True, Sample(draft_tokens=1000, accepted_tokens=560), 60, T0, T30)
    assert cleared.decision == "Keep" and cleared.low_since is None
    assert decide(0.5, True, just_above, 60, None, T30).decision == "Keep"  # never low: above is fine


def test_too_few_draft_tokens_or_no_data_decide_nothing() -> None:
    few = decide(0.5, True, Sample(draft_tokens=50, accepted_tokens=5), 60, T0, T60)
    assert few.decision == "TooFewTokens" and few.low_since == T0
    none = decide(0.5, True, None, 60, T0, T60)
    assert none.decision == "NoData"
    assert decide(0.5, True, Sample(draft_tokens=None, accepted_tokens=None), 60, None, T0).decision == "NoData"


def test_no_threshold_reports_only() -> None:
    assert decide(None, True, LOW, 60, None, T0).decision == "Keep"


def test_once_disabled_it_stays_disabled_for_the_generation() -> None:
    assert decide(0.5, True, HIGH, 60, T0, T60, already_disabled=True).decision == "Disabled"


def test_queries_cover_every_engine_pod() -> None:
    q = speculative.queries("ns", "llama", 60)
    assert 'pod=~"llama-vllm-.+"' in q["draft_tokens"] and "[60s]" in q["accepted_tokens"]


def test_operator_exports_acceptance_and_an_accepted_counter_that_survives_engine_restarts() -> None:
    from oculis_operator.metrics import OperatorMetrics

    m = OperatorMetrics()
    key = ("ns", "llama")

    def read(name: str) -> float | None:
        return m.registry.get_sample_value(name, {"namespace": "ns", "upstream": "llama"})
    m.observe_speculation(key, 0.3, 1000)
    m.observe_speculation(key, 0.25, 1500)
    m.observe_speculation(key, 0.2, 200)  # a pod restarted: its total began again
    assert read("oculis_speculative_acceptance_rate") == 0.2
    assert read("oculis_speculative_tokens_accepted_total") == 1000 + 500 + 200
