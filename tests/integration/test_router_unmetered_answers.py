"""No answer is metered as 0 tokens and $0 (QA pass 2, finding 4). The router asks every streamed
call for its usage chunk, whatever the client set (and strips it for a client that did not ask); an
answer that comes without usage, or a stream that ends before its usage chunk, is metered by an
estimate from its text and counted in `oculis_usage_estimated_total`. Budgets are charged the same
figures the metrics count. The real router over real HTTP, against the fake upstreams."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from e2e_support import eventually
from router_support import Fakes, RouterHandle

UP = "llama-8b"  # the fakes' "small" server; $0.05 / $0.08 per Mtok


@pytest.fixture
def budgeted(router: RouterHandle, fakes: Fakes) -> RouterHandle:
    cfg = fakes.config()
    cfg["oculis"]["server"] = {"budget": {"dollars": 1.0, "period": "day"}}
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.limiter is not None, timeout=10, interval=0.05,
               what="the budget config to apply")
    return router


def sample(router: RouterHandle, name: str, **labels: str) -> float:
    return router.app.state.metrics.registry.get_sample_value(name, labels) or 0.0


def budget_left(router: RouterHandle) -> float | None:
    for family in router.app.state.metrics.registry.collect():
        if family.name == "oculis_budget_remaining_dollars" and family.samples:
            return float(family.samples[0].value)
    return None


def billed_as_metered(router: RouterHandle) -> None:
    """The budget holds exactly what the metrics say was spent: one cost, in one place."""
    eventually(lambda: (left := budget_left(router)) is not None
               and abs(left - (1.0 - sample(router, "oculis_cost_dollars_total", upstream=UP))) < 1e-12,
               timeout=10, interval=0.02, what="the budget to be charged what the metrics metered")


def stream(router: RouterHandle, **extra: Any) -> list[dict[str, Any]]:
    body = {"model": UP, "stream": True, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **extra}
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", json=body, timeout=10) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_a_stream_that_declined_usage_is_metered_and_billed_like_any_other(budgeted: RouterHandle,
                                                                            fakes: Fakes) -> None:
    chunks = stream(budgeted, stream_options={"include_usage": False})
    assert fakes.scripts["small"].received[-1]["stream_options"] == {"include_usage": True}  # asked upstream
    assert all(c["choices"] for c in chunks) and not any(c.get("usage") for c in chunks)  # not shown to the client
    assert sample(budgeted, "oculis_prompt_tokens_total", upstream=UP) == 10
    assert sample(budgeted, "oculis_completion_tokens_total", upstream=UP) == 3
    assert sample(budgeted, "oculis_cost_dollars_total", upstream=UP) == pytest.approx((10 * 0.05 + 3 * 0.08) / 1e6)
    assert sample(budgeted, "oculis_usage_estimated_total", upstream=UP, reason="not_reported") == 0
    billed_as_metered(budgeted)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_an_answer_without_usage_is_estimated_from_its_text_never_zero(budgeted: RouterHandle, fakes: Fakes,
                                                                        streamed: bool) -> None:
    fakes.scripts["small"].no_usage = True  # an engine that reports no usage
    fakes.scripts["small"].reply = "seven words of answer text in here"
    if streamed:
        stream(budgeted)
    else:
        r = httpx.post(budgeted.server.url + "/v1/chat/completions", timeout=10,
                       json={"model": UP, "max_tokens": 20, "messages": [{"role": "user", "content": "hello there"}]})
        assert r.status_code == 200 and "usage" not in r.json()  # relayed as the engine answered
    assert sample(budgeted, "oculis_usage_estimated_total", upstream=UP, reason="not_reported") == 1
    assert sample(budgeted, "oculis_prompt_tokens_total", upstream=UP) > 0
    assert sample(budgeted, "oculis_completion_tokens_total", upstream=UP) >= 7  # the answer counts too
    assert sample(budgeted, "oculis_cost_dollars_total", upstream=UP) > 0
    billed_as_metered(budgeted)


def test_a_stream_the_client_left_is_metered_by_what_was_generated(budgeted: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].stream_delay = 0.2
    fakes.scripts["small"].reply = " ".join(["word"] * 100)
    body = {"model": UP, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", budgeted.server.url + "/v1/chat/completions", json=body, timeout=10) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one chunk read, then the client leaves
    eventually(lambda: sample(budgeted, "oculis_usage_estimated_total", upstream=UP, reason="stream_cut") == 1,
               timeout=10, interval=0.05, what="the cut stream to be metered by an estimate")
    assert sample(budgeted, "oculis_completion_tokens_total", upstream=UP) >= 1
    assert sample(budgeted, "oculis_cost_dollars_total", upstream=UP) > 0
    billed_as_metered(budgeted)


def test_a_whole_answer_the_client_left_is_metered_by_its_prompt(budgeted: RouterHandle, fakes: Fakes) -> None:
    fakes.scripts["small"].reply_delay = 20  # a long generation; the client gives up first
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(budgeted.server.url + "/v1/chat/completions", timeout=0.5,
                   json={"model": UP, "messages": [{"role": "user", "content": "hello there"}]})
    eventually(lambda: sample(budgeted, "oculis_usage_estimated_total", upstream=UP, reason="client_closed") == 1,
               timeout=10, interval=0.05, what="the abandoned call to be metered by its prompt")
    assert sample(budgeted, "oculis_prompt_tokens_total", upstream=UP) > 0  # the engine read it
    assert sample(budgeted, "oculis_completion_tokens_total", upstream=UP) == 0  # what it generated is unknown
    billed_as_metered(budgeted)
