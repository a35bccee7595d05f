"""Flow control with the real router in front of a real `oculis sim serve`: one replica with one seat
(`seats_per_replica: 1`), held by a long streamed request while others queue, then let go. What is
asserted is order and outcome (which requests the router let through first, 429s past the bound, a
queue emptied when its client leaves), never timings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router
from sim_support import start_sim, stop

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    proc, url = start_sim(MODEL, "--gpu", "H100-80GB", "--max-model-len", "8192", "--seed", "7")
    try:
        yield url
    finally:
        stop(proc)


def config(tmp: Path, sim: str, **route_fc: Any) -> Path:
    path = tmp / "flow.yaml"
    path.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "llama", "provider": "vllm", "model": MODEL, "endpoints": [sim + "/v1"]}],
        "routes": [{"name": "chat", "tiers": [{"name": "only", "upstream": "llama"}],
                    "flow_control": route_fc}],
        "server": {"flow_control": {"enabled": True, "seats_per_replica": 1, "queue_ttl_seconds": 600},
                   "limit_overrides": [{"match": {"tenant": "vip"}, "max_priority": 10}]},
    }}))
    return path


@pytest.fixture
def router(tmp_path: Path, sim: str, request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    route_fc = getattr(request, "param", {})  # the route's flow_control, when the test parametrizes it
    proc, url, mport = start_router(config(tmp_path, sim, **route_fc), tmp_path / "router.log")
    try:
        yield url, mport
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def metric(mport: int, name: str, **labels: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


class Blocker:
    """A long streamed request holding the only seat until `release` closes it."""

    def __init__(self, url: str) -> None:
        self.started = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(url,), daemon=True)
        self.thread.start()
        assert self.started.wait(60), "the blocking request never started streaming"

    def run(self, url: str) -> None:
        body = {"model": "chat", "max_tokens": 6000, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            for _ in resp.iter_lines():
                self.started.set()
                if self.stop.is_set():
                    return  # closing the stream ends the request: its seat frees

    def release(self) -> None:
        self.stop.set()
        self.thread.join(120)


def ask(url: str, tag: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": f"hello {tag}"}]}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=300)


def queued(mport: int) -> float:
    return metric(mport, "oculis_flow_queue_length")


def test_higher_priority_goes_first_and_a_light_tenant_is_not_starved(router: tuple[str, int]) -> None:
    url, mport = router
    blocker = Blocker(url)
    done: list[str] = []
    lock = threading.Lock()

    def one(tag: str, headers: dict[str, str]) -> None:
        r = ask(url, tag, headers)
        assert r.status_code == 200, r.text
        with lock:
            done.append(tag)

    jobs = [(f"heavy{n}", {"x-oculis-tenant": "heavy"}) for n in range(12)]
    jobs += [(f"light{n}", {"x-oculis-tenant": "light"}) for n in range(3)]
    jobs += [(f"vip{n}", {"x-oculis-tenant": "vip", "x-oculis-priority": "10"}) for n in range(2)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = []
        for tag, h in jobs:  # in this order: the heavy burst is queued before the others arrive
            futures.append(pool.submit(one, tag, h))
            n = len(futures)
            eventually(lambda n=n: queued(mport) >= n, what=f"{n} queued")
        assert done == []  # nothing passed the held seat
        blocker.release()
        for f in futures:
            f.result()
    # one seat: requests finish in the order they were let through
    assert done[:2] == ["vip0", "vip1"], done  # the higher priority first, though it came last
    light_at = [done.index(f"light{n}") for n in range(3)]
    assert max(light_at) < 2 + 2 * 3 + 1, done  # alternating with heavy: not behind its twelve
    assert [t for t in done if t.startswith("heavy")] == [f"heavy{n}" for n in range(12)]  # FIFO within a flow
    assert metric(mport, "oculis_flow_dispatches_total", priority="10") == 2
    assert queued(mport) == 0


@pytest.mark.parametrize("router", [{"max_queue": 2}], indirect=True)
def test_past_the_route_bound_429_with_retry_after_and_a_leaving_client_leaves_the_queue(
        router: tuple[str, int]) -> None:
    url, mport = router
    blocker = Blocker(url)
    with ThreadPoolExecutor(3) as pool:
        waiting = [pool.submit(ask, url, "w0")]
        eventually(lambda: queued(mport) == 1, what="one queued")
        # a client that gives up while queued (its own timeout): its place goes at once
        leaver = pool.submit(httpx.post, url + "/v1/chat/completions", timeout=3, json={
            "model": "chat", "max_tokens": 3, "messages": [{"role": "user", "content": "impatient"}]})
        with pytest.raises(httpx.TimeoutException):
            leaver.result()
        eventually(lambda: metric(mport, "oculis_flow_abandoned_total") == 1, what="the leaver counted")
        eventually(lambda: queued(mport) == 1, what="the leaver out of the queue")
        waiting.append(pool.submit(ask, url, "w1"))
        eventually(lambda: queued(mport) == 2, what="two queued")
        r = ask(url, "over")
        assert r.status_code == 429, r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60
        err = r.json()["error"]
        assert err["code"] == "fleet_saturated" and "queue" in err["message"]
        assert metric(mport, "oculis_flow_sheds_total", reason="queue_full") == 1
        blocker.release()
        assert all(f.result().status_code == 200 for f in waiting)
    assert queued(mport) == 0


@pytest.mark.parametrize("router", [{"queue_ttl_seconds": 1}], indirect=True)
def test_a_request_that_waits_past_the_ttl_gets_429(router: tuple[str, int]) -> None:
    url, mport = router
    blocker = Blocker(url)
    r = ask(url, "late")
    assert r.status_code == 429 and "TTL" in r.json()["error"]["message"]
    assert int(r.headers["retry-after"]) >= 1
    assert metric(mport, "oculis_flow_sheds_total", reason="ttl") == 1
    blocker.release()
    assert ask(url, "after").status_code == 200


def test_a_priority_the_key_may_not_use_is_403_naming_the_range(router: tuple[str, int]) -> None:
    url, _ = router
    r = ask(url, "greedy", {"x-oculis-priority": "50"})
    assert r.status_code == 403 and "-100 to 0" in r.json()["error"]["message"]
    r = ask(url, "junk", {"x-oculis-priority": "high"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "X-Oculis-Priority"
    assert ask(url, "vip", {"x-oculis-tenant": "vip", "x-oculis-priority": "10"}).status_code == 200


def test_the_priority_reaches_an_engine_with_priority_scheduling_and_orders_its_queue(tmp_path: Path) -> None:
    """An upstream marked priority_scheduling gets vLLM's `priority` field (the flow-control priority,
    negated: vLLM runs the lower value first; the client's own field replaced). The engine's own queue is
    the evidence, no mock sees the body: one sequence slot held, a low-priority request and then a
    high-priority one wait in the engine, and the high one is served first; through an upstream not
    marked (the same engine) the two are served as they came."""
    proc, engine = start_sim(MODEL, "--gpu", "H100-80GB", "--max-model-len", "8192", "--max-num-seqs", "1",
                             "--scheduling-policy", "priority")
    path = tmp_path / "prio.yaml"
    up = {"provider": "vllm", "model": MODEL, "endpoints": [engine + "/v1"]}
    path.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "aware", **up, "priority_scheduling": True}, {"name": "plain", **up}],
        "server": {"limit_overrides": [{"match": {"tenant": "vip"}, "max_priority": 10}]}}}))
    router, url, _ = start_router(path, tmp_path / "router.log")
    try:
        def waiting() -> float:
            text = httpx.get(engine + "/metrics", timeout=10).text
            return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                       if s.name == "vllm:num_requests_waiting")

        def served_order(model: str) -> list[str]:
            stop_ = threading.Event()
            started = threading.Event()

            def blocker() -> None:  # straight to the engine: holds its only sequence slot
                body = {"model": MODEL, "max_tokens": 6000, "stream": True,
                        "messages": [{"role": "user", "content": "go"}]}
                with httpx.stream("POST", engine + "/v1/chat/completions", json=body, timeout=120) as resp:
                    for _ in resp.iter_lines():
                        started.set()
                        if stop_.is_set():
                            return

            t = threading.Thread(target=blocker, daemon=True)
            t.start()
            assert started.wait(60)
            done: list[str] = []

            def one(tag: str, headers: dict[str, str]) -> None:
                r = httpx.post(url + "/v1/chat/completions", headers=headers, timeout=120, json={
                    "model": model, "max_tokens": 2, "priority": -999,  # the client's own field: replaced
                    "messages": [{"role": "user", "content": tag}]})
                assert r.status_code == 200, r.text
                done.append(tag)

            with ThreadPoolExecutor(2) as pool:
                low = pool.submit(one, "low", {"x-oculis-priority": "-50"})
                eventually(lambda: waiting() == 1, what="the low one waiting in the engine")
                high = pool.submit(one, "high", {"x-oculis-tenant": "vip", "x-oculis-priority": "10"})
                eventually(lambda: waiting() == 2, what="both waiting in the engine")
                stop_.set()
                t.join(120)
                low.result()
                high.result()
            return done

        assert served_order("aware") == ["high", "low"]
        assert served_order("plain") == ["low", "high"]  # no priority sent: first come, first served
    finally:
        router.terminate()
        router.wait(timeout=15)
        stop(proc)
