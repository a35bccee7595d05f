"""A route's tier on an upstream scaled to zero (the operator renders `scaled_to_zero: true`): the
router counts the demand (which wakes it) and applies the route's cold_start, saying which in a header
and a metric."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
from e2e_support import eventually
from prometheus_client import generate_latest
from router_support import Fakes, RouterHandle


def use(router: RouterHandle, fakes: Fakes, small_at_zero: bool, **route: Any) -> None:
    cfg = fakes.config(escalation={"enabled": True, "on_low_confidence": False}, cache={"enabled": False}, **route)
    for up in cfg["oculis"]["upstreams"]:
        if up["name"] == "llama-8b":
            up["scaled_to_zero"] = small_at_zero
    router.write(cfg)

    def applied() -> bool:
        rt = router.app.state.holder.current
        return (rt.upstreams["llama-8b"].scaled_to_zero == small_at_zero
                and rt.routes["adaptive"].route.cold_start == route.get("cold_start", "escalate")
                and rt.routes["adaptive"].route.cold_start_wait_seconds == route.get("cold_start_wait_seconds", 60))

    eventually(applied, timeout=10, what="the config applied")


def ask(router: RouterHandle) -> httpx.Response:
    # "hi" scores simple: the llama-8b tier first, then llama-70b.
    return httpx.post(router.server.url + "/v1/chat/completions", timeout=30,
                      json={"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]})


def metrics(router: RouterHandle) -> str:
    return generate_latest(router.app.state.metrics.registry).decode()


def test_cold_start_escalate_answers_from_the_next_serving_tier_and_counts_the_demand(
        router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, True)
    before = len(fakes.scripts["small"].received)
    r = ask(router)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hello from large"
    assert (r.headers["x-oculis-cold-start"], r.headers["x-oculis-upstream"]) == ("escalated", "llama-70b")
    assert r.headers["x-oculis-escalated"] == "true"
    assert len(fakes.scripts["small"].received) == before  # no doomed call to the upstream at zero
    m = metrics(router)
    assert 'oculis_upstream_demand_total{upstream="llama-8b"} 1.0' in m  # the wake signal
    assert 'oculis_cold_starts_total{action="escalated",route="adaptive",upstream="llama-8b"} 1.0' in m
    # Not a classifier escalation: the drift alarm must not read cold starts as drift.
    assert 'oculis_escalations_total{reason="low_confidence"' not in m


def test_cold_start_fail_is_a_503_at_once_with_retry_after(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, True, cold_start="fail", cold_start_wait_seconds=20)
    r = ask(router)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "cold_start_failed" and "scaled to zero" in r.json()["error"]["message"]
    assert (r.headers["x-oculis-cold-start"], r.headers["retry-after"]) == ("failed", "20")
    assert 'oculis_cold_starts_total{action="failed",route="adaptive",upstream="llama-8b"} 1.0' in metrics(router)


def test_cold_start_wait_holds_until_the_upstream_serves(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, True, cold_start="wait", cold_start_wait_seconds=20)
    woken = fakes.config(escalation={"enabled": True, "on_low_confidence": False}, cache={"enabled": False},
                         cold_start="wait", cold_start_wait_seconds=20)
    # The operator re-renders the config once a replica is ready.
    timer = threading.Timer(1.0, router.write, args=(woken,))
    timer.start()
    t0 = time.monotonic()
    r = ask(router)
    timer.join()
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "hello from small"
    assert r.headers["x-oculis-cold-start"] == "waited" and time.monotonic() - t0 >= 0.9
    assert 'oculis_cold_starts_total{action="waited",route="adaptive",upstream="llama-8b"} 1.0' in metrics(router)


def test_cold_start_wait_gives_a_clear_503_after_its_bound(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, True, cold_start="wait", cold_start_wait_seconds=0.5)
    r = ask(router)
    assert r.status_code == 503 and r.json()["error"]["code"] == "cold_start_timeout"
    assert "0.5 s" in r.json()["error"]["message"] and r.headers["x-oculis-cold-start"] == "timeout"


def test_serving_upstream_gets_no_cold_start_header(router: RouterHandle, fakes: Fakes) -> None:
    use(router, fakes, False)
    r = ask(router)
    assert r.status_code == 200 and "x-oculis-cold-start" not in r.headers
    assert 'oculis_upstream_demand_total{upstream="llama-8b"} 1.0' in metrics(router)


def test_every_upstreams_demand_series_exists_before_its_first_request(router: RouterHandle) -> None:
    """Prometheus's increase() reads a series born at 1 as no increase: the wake signal must start at 0."""
    m = metrics(router)
    for name in ("llama-8b", "llama-70b", "gpt4o", "claude"):
        assert f'oculis_upstream_demand_total{{upstream="{name}"}} 0.0' in m


def test_cold_start_messages_never_recommend_the_setting_in_force(router: RouterHandle, fakes: Fakes) -> None:
    """QA pass 2, finding 18: with every tier at zero, cold_start: escalate falls back to waiting, and its
    503 said "or set coldStart: escalate". The advice now depends on the setting and on the tiers."""
    cfg = fakes.config(cache={"enabled": False}, cold_start_wait_seconds=0.3)  # escalate, the default
    for up in cfg["oculis"]["upstreams"]:
        up["scaled_to_zero"] = True
    router.write(cfg)
    eventually(lambda: all(u.scaled_to_zero for u in router.app.state.holder.current.upstreams.values()),
               timeout=10, what="every upstream at zero")
    r = ask(router)
    assert r.status_code == 503 and r.headers["x-oculis-cold-start"] == "timeout"
    message = r.json()["error"]["message"]
    assert "set" not in message and "escalate had no later tier" in message, message
    use(router, fakes, True, cold_start="fail", cold_start_wait_seconds=5)  # the next tier serves
    assert "set the route's cold_start: escalate" in ask(router).json()["error"]["message"]


def test_a_failed_tier_before_a_tier_at_zero_says_it_was_skipped_and_wakes_it(router: RouterHandle,
                                                                             fakes: Fakes) -> None:
    """QA pass 2, finding 18 (failtocold): the first tier fails, the next is at zero and left out; the
    502 said only that the first failed. It now names the tier skipped, wakes it, and says when to retry."""
    cfg = fakes.config(escalation={"enabled": True, "on_low_confidence": False, "max_retries": 0},
                       cache={"enabled": False}, cold_start_wait_seconds=30)
    for up in cfg["oculis"]["upstreams"]:
        up["scaled_to_zero"] = up["name"] in ("llama-70b", "gpt4o")
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.upstreams["gpt4o"].scaled_to_zero, timeout=10,
               what="the later tiers at zero")
    fakes.scripts["small"].fail_times, fakes.scripts["small"].fail_status = 5, 500
    r = ask(router)
    assert r.status_code == 502
    assert "llama-70b, gpt4o are scaled to zero and were skipped" in r.json()["error"]["message"]
    assert (r.headers["x-oculis-cold-start"], r.headers["retry-after"]) == ("skipped", "30")
    m = metrics(router)
    assert 'oculis_upstream_demand_total{upstream="llama-70b"} 1.0' in m  # woken, as a first tier would be
