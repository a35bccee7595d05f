"""Which tier a request was routed to, which answered, and why it moved (QA pass 2, findings 19 and 20):
every escalation says why (low_confidence, cold_start, upstream_error, answer) in
`x-oculis-escalation-reason` and the decision log; the log names the tier first routed to and the tiers
that failed or were replaced on the way; a request no tier could answer, or whose client left a
non-streamed answer, keeps the tier and upstream it was at, in its headers, its log line and
`oculis_requests_total`. The real router over real HTTP, against the fake upstreams."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_support import eventually
from router_support import Fakes, RouterHandle


@pytest.fixture
def logged(router: RouterHandle, fakes: Fakes, tmp_path: Path) -> tuple[RouterHandle, Path]:
    """The fakes' route with a decision log (no cache, no retries: each tier is one attempt)."""
    sink = tmp_path / "decisions.jsonl"
    serve(router, fakes.config(cache={"enabled": False}, decision_log={"sink": str(sink)},
                               escalation={"enabled": True, "on_low_confidence": True, "confidence_threshold": 0.6,
                                           "max_retries": 0}))
    return router, sink


def serve(router: RouterHandle, cfg: dict[str, Any]) -> None:
    before = router.app.state.holder.current.digest
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.digest != before, timeout=10, interval=0.05,
               what="the config to apply")


def ask(router: RouterHandle, content: str = "hi", **extra: Any) -> httpx.Response:
    return httpx.post(router.server.url + "/v1/chat/completions", timeout=30,
                      json={"model": "adaptive", "messages": [{"role": "user", "content": content}], **extra})


def last_line(sink: Path) -> dict[str, Any]:
    return json.loads(sink.read_text().splitlines()[-1])


def counted(router: RouterHandle, **labels: str) -> float:
    return router.app.state.metrics.registry.get_sample_value("oculis_requests_total", labels) or 0.0


def test_a_failover_says_why_and_names_the_tier_routed_to_and_the_one_that_failed(
        logged: tuple[RouterHandle, Path], fakes: Fakes) -> None:
    router, sink = logged
    fakes.scripts["small"].fail_times, fakes.scripts["small"].fail_status = 5, 500
    r = ask(router)
    assert r.status_code == 200 and r.headers["x-oculis-tier"] == "standard"
    assert r.headers["x-oculis-escalation-reason"] == "upstream_error"
    assert r.headers["x-oculis-failed-tiers"] == "simple"
    line = last_line(sink)
    want = {"routed_tier": "simple", "tier": "standard", "escalated": True, "escalation_reason": "upstream_error",
            "failed_tiers": ["simple"], "status": 200}
    assert {k: line.get(k) for k in want} == want


def test_a_request_no_tier_could_answer_names_the_tier_that_failed_last(logged: tuple[RouterHandle, Path],
                                                                         fakes: Fakes) -> None:
    router, sink = logged
    for s in ("small", "large", "frontier"):
        fakes.scripts[s].fail_times, fakes.scripts[s].fail_status = 5, 500
    r = ask(router)
    assert r.status_code == 502
    assert (r.headers["x-oculis-tier"], r.headers["x-oculis-upstream"]) == ("complex", "gpt4o")
    assert r.headers["x-oculis-failed-tiers"] == "simple,standard"
    line = last_line(sink)
    want = {"status": 502, "routed_tier": "simple", "tier": "complex", "upstream": "gpt4o",
            "failed_tiers": ["simple", "standard"], "escalation_reason": "upstream_error"}
    assert {k: line.get(k) for k in want} == want
    assert counted(router, route="adaptive", tier="complex", upstream="gpt4o", outcome="error_502") == 1


def test_a_single_tier_route_that_fails_is_logged_with_its_tier(router: RouterHandle, fakes: Fakes,
                                                                  tmp_path: Path) -> None:
    sink = tmp_path / "decisions.jsonl"
    cfg = fakes.config()
    cfg["oculis"]["routes"].append({"name": "one", "decision_log": {"sink": str(sink)},
                                    "escalation": {"max_retries": 0},
                                    "tiers": [{"name": "only", "upstream": "llama-8b"}]})
    serve(router, cfg)
    fakes.scripts["small"].fail_times, fakes.scripts["small"].fail_status = 5, 500
    r = httpx.post(router.server.url + "/v1/chat/completions",
                   json={"model": "one", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 502
    line = last_line(sink)
    assert (line["tier"], line["upstream"], line["routed_tier"]) == ("only", "llama-8b", "only")
    assert line["escalated"] is False
    assert "escalation_reason" not in line and "failed_tiers" not in line  # nothing to fail over to


def test_low_confidence_and_a_replaced_answer_each_say_so(logged: tuple[RouterHandle, Path], fakes: Fakes) -> None:
    router, sink = logged
    r = ask(router, "\U0001f9ff\U0001fa90" * 30)  # unreadable to the classifier: confidence 0
    assert r.headers["x-oculis-escalation-reason"] == "low_confidence"
    assert last_line(sink)["escalation_reason"] == "low_confidence" and last_line(sink)["routed_tier"] == "standard"
    cfg = fakes.config(cache={"enabled": False}, decision_log={"sink": str(sink)},
                       escalation={"enabled": True, "on_low_confidence": False,
                                   "on_answer": {"min_mean_logprob": -1.0}})
    serve(router, cfg)
    for s in ("small", "large"):
        fakes.scripts[s].give_logprobs = True
    fakes.scripts["small"].logprob = -2.5
    r = ask(router)
    assert r.headers["x-oculis-escalation-reason"] == "answer" and r.headers["x-oculis-replaced-tiers"] == "simple"
    line = last_line(sink)
    want = {"routed_tier": "simple", "tier": "standard", "escalation_reason": "answer", "replaced_tiers": ["simple"]}
    assert {k: line.get(k) for k in want} == want and "failed_tiers" not in line


def test_a_client_that_leaves_a_slow_answer_keeps_its_tier_and_upstream(logged: tuple[RouterHandle, Path],
                                                                         fakes: Fakes) -> None:
    router, sink = logged
    fakes.scripts["small"].reply_delay = 20
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router.server.url + "/v1/chat/completions", timeout=0.5,
                   json={"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]})
    eventually(lambda: counted(router, route="adaptive", tier="simple", upstream="llama-8b",
                               outcome="client_closed") == 1, timeout=10, interval=0.05,
               what="the client_closed count with the tier and upstream it was at")
    eventually(lambda: sink.exists() and last_line(sink)["status"] == 499, timeout=10, interval=0.05,
               what="the decision line of the request whose client left")
    assert (last_line(sink)["tier"], last_line(sink)["upstream"]) == ("simple", "llama-8b")


def test_a_cold_start_escalation_says_so(logged: tuple[RouterHandle, Path], fakes: Fakes) -> None:
    router, sink = logged
    cfg = fakes.config(cache={"enabled": False}, decision_log={"sink": str(sink)})  # cold_start: escalate (default)
    next(u for u in cfg["oculis"]["upstreams"] if u["name"] == "llama-8b")["scaled_to_zero"] = True
    serve(router, cfg)
    r = ask(router)
    assert r.headers["x-oculis-cold-start"] == "escalated" and r.headers["x-oculis-escalation-reason"] == "cold_start"
    assert last_line(sink)["escalation_reason"] == "cold_start" and last_line(sink)["routed_tier"] == "standard"


def test_a_client_that_leaves_a_buffered_stream_stops_the_upstream_and_keeps_its_labels(
        router: RouterHandle, fakes: Fakes) -> None:
    """A buffered stream (escalation.on_answer.buffer_streams) is a non-streamed call until the answer is
    whole and checked: a client leaving meanwhile was not noticed, so the engine kept generating."""
    serve(router, fakes.config(cache={"enabled": False},
                               escalation={"enabled": True, "on_low_confidence": False,
                                           "on_answer": {"min_mean_logprob": -1.0, "buffer_streams": True}}))
    fakes.scripts["small"].reply_delay = 20
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(router.server.url + "/v1/chat/completions", timeout=0.5,
                   json={"model": "adaptive", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    eventually(lambda: fakes.scripts["small"].streams_cut, timeout=5, interval=0.05,
               what="the upstream to stop generating after the client left")
    eventually(lambda: counted(router, route="adaptive", tier="simple", upstream="llama-8b",
                               outcome="client_closed") == 1, timeout=10, interval=0.05,
               what="the client_closed count with its tier and upstream")
