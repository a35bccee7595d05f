"""An upstream's canary revision over real HTTP: the router sends its percent of the upstream's
requests to the canary's base_url, says which revision answered (x-oculis-revision and
oculis_upstream_revision_requests_total), and a canary that fails costs no request: it is retried on
the stable revision even with no retry budget left."""

from __future__ import annotations

import math
from typing import Any

import httpx
from e2e_support import eventually
from fake_upstreams import free_port
from router_support import Fakes, RouterHandle

CHAT = "/v1/chat/completions"


def serve(router: RouterHandle, fakes: Fakes, canary_url: str, percent: int, **route: Any) -> None:
    """llama-8b (the `small` fake) with a canary at `canary_url`, and a one-tier route `only` over it."""
    cfg = fakes.config()
    for up in cfg["oculis"]["upstreams"]:
        if up["name"] == "llama-8b":
            up["canary"] = {"base_url": canary_url, "percent": percent}
    cfg["oculis"]["routes"].append({"name": "only", "tiers": [{"name": "t", "upstream": "llama-8b"}], **route})
    before = router.app.state.holder.current.digest
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.digest != before, timeout=10, interval=0.05,
               what="the router to load the config with a canary")


def revisions(router: RouterHandle) -> dict[str, float]:
    out = {}
    for metric in router.app.state.metrics.registry.collect():
        for s in metric.samples:
            if s.name == "oculis_upstream_revision_requests_total" and s.labels["upstream"] == "llama-8b":
                out[s.labels["revision"]] = s.value
    return out


def ask(router: RouterHandle, model: str, i: int, stream: bool = False) -> httpx.Response:
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": f"hi {i}"}]}
    return httpx.post(router.server.url + CHAT, json=body, timeout=30)


def test_the_canary_answers_its_percent_of_the_requests_and_says_so(router: RouterHandle, fakes: Fakes) -> None:
    n, percent = 300, 30
    serve(router, fakes, fakes.servers["large"].url + "/v1", percent)  # the `large` fake plays the canary
    seen = []
    for i in range(n):
        r = ask(router, "llama-8b", i, stream=i % 3 == 0)  # streams and whole answers alike
        assert r.status_code == 200, r.text
        seen.append(r.headers["x-oculis-revision"])
    canary = seen.count("canary")
    # each request is a Bernoulli draw: within 4 standard deviations of n * p (fails by chance ~1 in 15,000)
    assert abs(canary - n * percent / 100) <= 4 * math.sqrt(n * percent / 100 * (1 - percent / 100)), canary
    assert len(fakes.scripts["large"].received) == canary and len(fakes.scripts["small"].received) == n - canary
    assert revisions(router) == {"canary": canary, "stable": n - canary}


def test_a_failing_canary_is_retried_on_stable_even_without_retries(router: RouterHandle, fakes: Fakes) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens: every canary attempt fails to connect
    serve(router, fakes, dead, 99, escalation={"max_retries": 0})
    for i in range(20):
        r = ask(router, "only", i)
        assert r.status_code == 200, r.text
        assert r.headers["x-oculis-revision"] == "stable" and r.headers["x-oculis-upstream"] == "llama-8b"
    assert len(fakes.scripts["small"].received) == 20 and revisions(router) == {"stable": 20}


def test_without_a_canary_every_answer_is_stable(router: RouterHandle, fakes: Fakes) -> None:
    for i in range(5):
        r = ask(router, "llama-8b", i)
        assert r.status_code == 200 and r.headers["x-oculis-revision"] == "stable"
    assert revisions(router) == {"stable": 5}


def failures(router: RouterHandle, revision: str) -> dict[str, float]:
    out = {}
    for metric in router.app.state.metrics.registry.collect():
        for s in metric.samples:
            if s.name == "oculis_upstream_failures_total" and s.labels["upstream"] == "llama-8b" \
                    and s.labels["revision"] == revision:
                out[s.labels["kind"]] = s.value
    return out


def test_failed_canary_attempts_are_counted_and_logged_once(router: RouterHandle, fakes: Fakes,
                                                            caplog: Any) -> None:
    """QA pass 2, finding 10: a failing canary answered no request (each of its attempts is retried on
    stable), so nothing showed it; its failed attempts are counted by kind and said once."""
    import logging

    fakes.scripts["large"].fail_times, fakes.scripts["large"].fail_status = 1000, 500  # the canary: always 500
    canary_url = fakes.servers["large"].url + "/v1"
    serve(router, fakes, canary_url, 99, escalation={"max_retries": 0})
    with caplog.at_level(logging.WARNING, logger="oculis.router"):
        for i in range(6):
            assert ask(router, "only", i, stream=i % 2 == 1).status_code == 200  # whole answers and streams
    tried = len(fakes.scripts["large"].received)
    assert tried >= 1 and failures(router, "canary") == {"status_500": tried}
    assert failures(router, "stable") == {}  # no tier failed: every request was answered by stable
    said = [r for r in caplog.records if "canary of upstream llama-8b" in r.getMessage()]
    assert len(said) == 1 and canary_url in said[0].getMessage()


def test_a_canary_that_asks_to_wait_long_is_retried_on_stable_not_escalated(router: RouterHandle,
                                                                              fakes: Fakes) -> None:
    """A canary's 429 with a long Retry-After used to move the request to the next tier at once (as a
    rate-limited stable revision should): the canary must cost at most one attempt, never a tier."""
    fakes.scripts["large"].fail_times, fakes.scripts["large"].fail_status = 1000, 429
    fakes.scripts["large"].fail_headers = {"retry-after": "30"}
    cfg = fakes.config()
    for up in cfg["oculis"]["upstreams"]:
        if up["name"] == "llama-8b":
            up["canary"] = {"base_url": fakes.servers["large"].url + "/v1", "percent": 99}
    cfg["oculis"]["routes"].append({"name": "two", "tiers": [
        {"name": "a", "match": {"complexity_below": 0.99}, "upstream": "llama-8b"}, {"name": "b", "upstream": "gpt4o"}],
        "escalation": {"max_retries": 0}})
    router.write(cfg)
    eventually(lambda: "two" in router.app.state.holder.current.routes, timeout=10, interval=0.05,
               what="the two-tier route to load")
    for i in range(4):
        r = ask(router, "two", i, stream=i % 2 == 1)
        assert r.status_code == 200 and r.headers["x-oculis-upstream"] == "llama-8b", r.text
        assert r.headers["x-oculis-revision"] == "stable"
    assert not fakes.scripts["frontier"].received  # never escalated to the next tier
    tried = len(fakes.scripts["large"].received)
    assert tried >= 1 and failures(router, "canary") == {"rate_limited": tried}
