"""`oculis_adapter_requests_total` counted 503 `adapter_not_loaded` refusals while the README said it counted
answers (QA3 Part 2 #21). It counts demand (requests asking for the adapter, any outcome, as
oculis_routed_requests_total counts the tier a request was sent to): the metric's help and the README now say
so, and name where outcomes are."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from oculis_router.metrics import Metrics

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_adapter_counter_says_it_counts_every_outcome() -> None:
    m = Metrics(CollectorRegistry())
    assert "any outcome" in m.adapter_requests._documentation and "oculis_requests_total" in (
        m.adapter_requests._documentation)
    text = " ".join(README.read_text().split())
    assert "counts the requests asking for each adapter, whatever their outcome" in text
