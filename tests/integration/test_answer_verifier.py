"""Escalation on the answer by a verifier model (`escalation.on_answer.verifier`): a fake hosted
upstream grades each checked answer; one scored below the bar is replaced by the next tier's, the
grading is billed, and a verifier that fails or gives no score never costs the client its answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from e2e_support import eventually
from prometheus_client import generate_latest
from router_support import Fakes, RouterHandle

from oculis.router import DEFAULT_RUBRIC


def use(router: RouterHandle, fakes: Fakes, grade: str, sink: Path | None = None, verifier: str = "claude",
        **on_answer: Any) -> None:
    """The route checks answers with a verifier (by default the Anthropic fake, which replies `grade`)."""
    fakes.scripts["claude"].anthropic_text = grade
    on_answer = {"verifier": {"upstream": verifier, "min_score": 7}, **on_answer}
    extra = {"decision_log": {"sink": str(sink)}} if sink else {}
    cfg = fakes.config(escalation={"enabled": True, "on_low_confidence": False, "on_answer": on_answer},
                       cache={"enabled": False}, **extra)
    router.write(cfg)

    def applied() -> bool:
        got = router.app.state.holder.current.routes["adaptive"].route.escalation.on_answer
        return got is not None and got.model_dump(exclude_unset=True) == on_answer

    eventually(applied, timeout=10, what="the on_answer config applied")


def ask(router: RouterHandle, content: str = "hi") -> httpx.Response:
    return httpx.post(router.server.url + "/v1/chat/completions", timeout=30, json={
        "model": "adaptive", "messages": [{"role": "user", "content": content}]})


def metrics(router: RouterHandle) -> str:
    return generate_latest(router.app.state.metrics.registry).decode()


def test_an_answer_graded_below_the_bar_is_replaced_and_the_grading_is_billed(router: RouterHandle, fakes: Fakes,
                                                                              tmp_path: Path) -> None:
    sink = tmp_path / "decisions.jsonl"
    use(router, fakes, "Score: 3", sink)
    r = ask(router, "What is the capital of Australia?")
    assert r.status_code == 200, r.text
    # simple (8B) and standard (70B) were each graded 3 and replaced; the last tier is never graded.
    assert r.json()["choices"][0]["message"]["content"] == "hello from frontier"
    assert (r.headers["x-oculis-tier"], r.headers["x-oculis-escalation-reason"]) == ("complex", "answer")
    assert r.headers["x-oculis-answer-score"] == "3"  # the replaced answer's grade: why it moved
    assert r.headers["x-oculis-replaced-tiers"] == "simple,standard"  # the whole chain, for the cascade's cost
    graded = fakes.scripts["claude"].received
    assert len(graded) == 2
    # The rubric is the system prompt (with the upstream's prompt-cache breakpoint: every grading shares it).
    assert graded[0]["system"][0]["text"] == DEFAULT_RUBRIC
    assert graded[0]["temperature"] == 0 and graded[0]["max_tokens"] == 8
    asked = graded[0]["messages"][-1]["content"]
    text = asked if isinstance(asked, str) else " ".join(p["text"] for p in asked)
    assert "user: What is the capital of Australia?" in text and "Answer to grade:\nhello from small" in text
    assert "hello from large" in json.dumps(graded[1])
    m = metrics(router)
    assert 'oculis_escalations_total{reason="low_answer_score",route="adaptive"} 2.0' in m
    assert 'oculis_answer_grades_total{outcome="fail",route="adaptive",verifier="claude"} 2.0' in m
    # the tier the request was routed to, and the answers each tier produced that a later one replaced
    # (route analyze and cost report charge them to this route and tier: attribution_routed_vs_final)
    assert 'oculis_routed_requests_total{route="adaptive",tier="simple",upstream="llama-8b"} 1.0' in m
    assert ('oculis_answers_replaced_total{reason="low_answer_score",route="adaptive",tier="simple",'
            'upstream="llama-8b"} 1.0') in m
    assert ('oculis_answers_replaced_total{reason="low_answer_score",route="adaptive",tier="standard",'
            'upstream="llama-70b"} 1.0') in m
    assert 'oculis_completion_tokens_total{upstream="claude"}' in m  # the verifier's tokens are counted ...
    assert 'oculis_cost_dollars_total{upstream="claude"} 0.0\n' not in m  # ... and priced
    line = json.loads(sink.read_text().splitlines()[-1])
    assert (line["escalation_reason"], line["answer_score"], line["tier"]) == ("answer", 3, "complex")


def test_an_answer_graded_at_the_bar_stays_and_says_its_grade(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, "Score: 9")
    r = ask(router)
    assert r.json()["choices"][0]["message"]["content"] == "hello from small"
    assert (r.headers["x-oculis-escalated"], r.headers["x-oculis-answer-score"]) == ("false", "9")
    assert not fakes.scripts["large"].received
    assert 'oculis_answer_grades_total{outcome="pass",route="adaptive",verifier="claude"} 1.0' in metrics(router)


def test_a_verifier_that_fails_or_gives_no_score_keeps_the_answer(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, "I would rather not say")
    r = ask(router)
    assert r.json()["choices"][0]["message"]["content"] == "hello from small"
    assert "x-oculis-answer-score" not in r.headers and r.headers["x-oculis-escalated"] == "false"
    use(router, fakes, "", verifier="gpt4o")  # a verifier that fails (it is also the last tier: never graded)
    fakes.scripts["frontier"].fail_times = 100
    r = ask(router)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hello from small"
    m = metrics(router)
    assert 'oculis_answer_grades_total{outcome="unscored",route="adaptive",verifier="claude"} 1.0' in m
    assert 'oculis_answer_grades_total{outcome="error",route="adaptive",verifier="gpt4o"} 1.0' in m
    failures = [ln for ln in m.splitlines() if ln.startswith("oculis_upstream_failures_total{")]
    assert any('upstream="gpt4o"' in ln for ln in failures)
    assert not fakes.scripts["large"].received


def test_an_answer_the_logprobs_doubt_is_not_graded_and_one_they_pass_is(router: RouterHandle, fakes: Fakes) -> None:
    for s in ("small", "large"):
        fakes.scripts[s].give_logprobs = True
    fakes.scripts["small"].logprob = -2.5  # unsure: replaced without a grading
    use(router, fakes, "Score: 8", min_mean_logprob=-1.0)
    r = ask(router)
    assert r.json()["choices"][0]["message"]["content"] == "hello from large"
    assert float(r.headers["x-oculis-answer-logprob"]) == -2.5
    graded = fakes.scripts["claude"].received
    assert len(graded) == 1 and "hello from large" in json.dumps(graded[0])  # only the sure answer was graded


def test_a_buffered_stream_is_graded_like_a_whole_answer(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, "Score: 2", buffer_streams=True)
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", timeout=30, json={
            "model": "adaptive", "stream": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert (r.headers["x-oculis-tier"], r.headers["x-oculis-answer-score"]) == ("complex", "2")
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in map(json.loads, events[:-1])
                      if c["choices"])
    assert content == "hello from frontier"


def test_a_verifier_at_zero_is_woken_not_waited_for(router: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["claude"].anthropic_text = "Score: 1"
    cfg = fakes.config(escalation={"enabled": True, "on_low_confidence": False,
                                   "on_answer": {"verifier": {"upstream": "claude", "min_score": 7}}},
                       cache={"enabled": False})
    next(u for u in cfg["oculis"]["upstreams"] if u["name"] == "claude")["scaled_to_zero"] = True
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.upstreams["claude"].scaled_to_zero, timeout=10,
               what="the verifier at zero")
    r = ask(router)
    assert r.json()["choices"][0]["message"]["content"] == "hello from small"  # kept, ungraded
    assert not fakes.scripts["claude"].received
    m = metrics(router)
    assert 'oculis_answer_grades_total{outcome="cold",route="adaptive",verifier="claude"} 1.0' in m
    assert 'oculis_upstream_demand_total{upstream="claude"} 1.0' in m  # what wakes it
