"""Escalation on the answer (`escalation.on_answer`): fake self-hosted upstreams return token
logprobs; an answer less sure than the bar is replaced by the next tier's, counted and said so.
And the route's decision log, which records such decisions per request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from e2e_support import eventually
from prometheus_client import generate_latest
from router_support import Fakes, RouterHandle


def use(router: RouterHandle, fakes: Fakes, **on_answer: Any) -> None:
    # "hi" scores simple: the 8B tier answers first, then the 70B one, then gpt-4o (hosted: never asked).
    cfg = fakes.config(escalation={"enabled": True, "on_low_confidence": False, "on_answer": on_answer},
                       cache={"enabled": False})
    router.write(cfg)
    def applied() -> bool:
        got = router.app.state.holder.current.routes["adaptive"].route.escalation.on_answer
        return got is not None and got.model_dump(exclude_unset=True) == on_answer

    eventually(applied, timeout=10, what="the on_answer config applied")


def ask(router: RouterHandle, **body: Any) -> httpx.Response:
    return httpx.post(router.server.url + "/v1/chat/completions", timeout=30, json={
        "model": "adaptive", "messages": [{"role": "user", "content": "hi"}], **body})


def metric(router: RouterHandle, needle: str) -> bool:
    return needle in generate_latest(router.app.state.metrics.registry).decode()


def test_an_unsure_answer_is_replaced_by_the_next_tiers_and_both_are_counted(router: RouterHandle,
                                                                             fakes: Fakes) -> None:
    use(router, fakes, min_mean_logprob=-1.0)
    for s in ("small", "large"):
        fakes.scripts[s].give_logprobs = True
    fakes.scripts["small"].logprob = -2.5  # unsure
    fakes.scripts["large"].logprob = -0.2
    r = ask(router)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hello from large"
    assert (r.headers["x-oculis-tier"], r.headers["x-oculis-escalated"]) == ("standard", "true")
    assert r.headers["x-oculis-escalation-reason"] == "answer"
    assert float(r.headers["x-oculis-answer-logprob"]) == -2.5  # the replaced answer's, why it moved
    assert fakes.scripts["small"].received[-1]["logprobs"] is True  # the router asked for them
    assert r.json()["choices"][0].get("logprobs") is None  # ... and the client, who did not, gets none
    assert metric(router, 'oculis_escalations_total{reason="low_answer_confidence",route="adaptive"} 1.0')
    # The first answer's tokens were paid for: both upstreams' usage is counted.
    assert metric(router, 'oculis_completion_tokens_total{upstream="llama-8b"} 3.0')
    assert metric(router, 'oculis_completion_tokens_total{upstream="llama-70b"} 3.0')


def test_a_sure_answer_stays_and_says_how_sure(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, min_mean_logprob=-1.0)
    fakes.scripts["small"].give_logprobs = True
    r = ask(router, logprobs=True)  # the client wants them too: kept
    assert r.json()["choices"][0]["message"]["content"] == "hello from small"
    assert r.headers["x-oculis-escalated"] == "false" and float(r.headers["x-oculis-answer-logprob"]) == -0.5
    assert r.json()["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5
    assert not fakes.scripts["large"].received


def test_an_unsure_answer_is_kept_when_no_later_tier_can_answer(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, min_mean_logprob=-1.0)
    fakes.scripts["small"].give_logprobs = True
    fakes.scripts["small"].logprob = -3.0
    fakes.scripts["large"].fail_times = fakes.scripts["frontier"].fail_times = 100
    r = ask(router)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello from small"
    assert r.headers["x-oculis-tier"] == "simple"


def test_streams_are_checked_only_when_the_route_buffers_them(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].give_logprobs = True
    fakes.scripts["small"].logprob = -3.0
    use(router, fakes, min_mean_logprob=-1.0)
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", timeout=30, json={
            "model": "adaptive", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        text = "".join(r.iter_text())
    assert r.headers["x-oculis-tier"] == "simple" and "from" in text  # relayed as it came, unchecked
    use(router, fakes, min_mean_logprob=-1.0, buffer_streams=True)
    fakes.scripts["large"].give_logprobs = True
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", timeout=30, json={
            "model": "adaptive", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert (r.headers["x-oculis-tier"], r.headers["x-oculis-escalation-reason"]) == ("standard", "answer")
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "hello from large"
    assert any(c.get("usage") for c in chunks)
    assert "stream" not in fakes.scripts["large"].received[-1]  # asked whole, sent as a stream


def test_each_request_leaves_a_decision_line_with_the_prompt_hashed_unless_opted_in(
        router: RouterHandle, fakes: Fakes, tmp_path: Path) -> None:
    sink = tmp_path / "decisions.jsonl"
    for s in ("small", "large"):
        fakes.scripts[s].give_logprobs = True
    fakes.scripts["small"].logprob = -2.5
    cfg = fakes.config(escalation={"enabled": True, "on_low_confidence": False, "on_answer": {"min_mean_logprob": -1}},
                       cache={"enabled": False}, decision_log={"sink": str(sink)})
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.routes["adaptive"].route.decision_log is not None, timeout=10)
    assert ask(router).status_code == 200
    line = json.loads(sink.read_text().splitlines()[-1])
    want = {"route": "adaptive", "tier": "standard", "upstream": "llama-70b", "status": 200, "escalated": True,
            "escalation_reason": "answer", "answer_logprob": -2.5, "revision": "stable"}
    assert {k: line[k] for k in want} == want
    assert 0 <= line["complexity"] <= 1 and 0 <= line["confidence"] <= 1 and line["prompt_tokens"] >= 1
    assert len(line["prompt_sha256"]) == 64 and "messages" not in line and "hi" not in sink.read_text()
    cfg["oculis"]["routes"][0]["decision_log"]["include_prompts"] = True
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.routes["adaptive"].route.decision_log.include_prompts,
               timeout=10)
    ask(router)
    line = json.loads(sink.read_text().splitlines()[-1])
    assert line["messages"] == [{"role": "user", "content": "hi"}]  # a suite line, once outcomes are added


def test_a_request_no_tier_could_answer_is_logged_too(router: RouterHandle, fakes: Fakes, tmp_path: Path) -> None:
    sink = tmp_path / "decisions.jsonl"
    router.write(fakes.config(cache={"enabled": False}, decision_log={"sink": str(sink)},
                              escalation={"max_retries": 0}))
    eventually(lambda: router.app.state.holder.current.routes["adaptive"].route.decision_log is not None, timeout=10)
    for s in ("small", "large", "frontier"):
        fakes.scripts[s].fail_times = 10
    assert ask(router).status_code == 502
    line = json.loads(sink.read_text().splitlines()[-1])
    assert line["status"] == 502 and line["route"] == "adaptive" and 0 <= line["complexity"] <= 1


def test_unmetered_answers_an_answer_without_logprobs_is_counted_not_silently_passed(router: RouterHandle,
                                                                                     fakes: Fakes) -> None:
    """QA-2 finding 8: an engine that drops logprobs silently disabled the check; it is now counted
    (outcome no_logprobs) beside the answers that passed or failed it."""
    use(router, fakes, min_mean_logprob=-1.0)
    fakes.scripts["small"].give_logprobs = False
    r = ask(router)
    assert r.status_code == 200 and r.headers["x-oculis-tier"] == "simple"
    assert "x-oculis-answer-logprob" not in r.headers
    assert metric(router, 'oculis_answer_logprob_checks_total{outcome="no_logprobs",route="adaptive",'
                          'upstream="llama-8b"} 1.0')
    fakes.scripts["small"].give_logprobs = True
    fakes.scripts["small"].logprob = -0.2
    assert ask(router).status_code == 200
    assert metric(router, 'oculis_answer_logprob_checks_total{outcome="pass",route="adaptive",upstream="llama-8b"} 1.0')
