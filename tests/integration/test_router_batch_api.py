"""The OpenAI Batch API on the real router in front of a real `oculis sim serve`, driven by the real
`openai` SDK: upload, create, poll, download, cancel; a router killed mid-batch resumes it with every
line recorded exactly once; one tenant cannot see another's files or batches; bad input refused naming
the line; and batch lines only take seats interactive requests leave free (the route's decision log
gives the order requests were served in, one seat). Order and outcomes are asserted, never timings."""

from __future__ import annotations

import io
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import free_port
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router
from sim_support import start_sim, stop
from time_scale import Deadline

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    proc, url = start_sim(MODEL, "--gpu", "H100-80GB", "--max-model-len", "8192", "--seed", "11")
    try:
        yield url
    finally:
        stop(proc)


class RedisServer:
    """A real redis-server on a free port (no persistence: the tests kill the router, not Redis)."""

    def __init__(self, where: Path) -> None:
        self.port, self.where = free_port(), where
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(where)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = Deadline(30)
        while not deadline.expired():
            ping = subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True, text=True)
            if ping.stdout.strip() == "PONG":
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=15)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    if subprocess.run(["which", "redis-server"], capture_output=True).returncode:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    r = RedisServer(tmp_path)
    try:
        yield r
    finally:
        r.stop()


class Router:
    def __init__(self, tmp: Path, sim: str, concurrency: int = 2, redis_url: str | None = None) -> None:
        self.tmp = tmp
        self.decisions = tmp / "decisions.jsonl"
        self.config = tmp / "batch.yaml"
        self.config.write_text(yaml.safe_dump({"oculis": {
            "upstreams": [{"name": "llama", "provider": "vllm", "model": MODEL, "endpoints": [sim + "/v1"],
                           "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}],
            "routes": [{"name": "chat", "tiers": [{"name": "only", "upstream": "llama"}],
                        "decision_log": {"sink": str(self.decisions), "include_prompts": True}}],
            "server": {"flow_control": {"enabled": True, "seats_per_replica": 1, "queue_ttl_seconds": 600},
                       "batch": {"enabled": True, "directory": str(tmp / "batches"), "concurrency": concurrency,
                                 "max_requests_per_batch": 100, "max_file_bytes": 64 * 1024},
                       **({"redis_url": redis_url} if redis_url else {})},
        }}))
        self.start()

    def start(self) -> None:
        self.proc, self.url, self.mport = start_router(self.config, self.tmp / "router.log")

    def stop(self, kill: bool = False) -> None:
        self.proc.kill() if kill else self.proc.terminate()
        self.proc.wait(timeout=15)

    def client(self, key: str = "key-a", tenant: str | None = None) -> openai.OpenAI:
        headers = {"x-oculis-tenant": tenant} if tenant else None
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, default_headers=headers, max_retries=0)

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.mport}/metrics", timeout=10).text
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture
def router(tmp_path: Path, sim: str, request: pytest.FixtureRequest) -> Iterator[Router]:
    r = Router(tmp_path, sim, **getattr(request, "param", {}))
    try:
        yield r
    finally:
        r.stop()


def jsonl(n: int, tag: str = "line", max_tokens: int = 4, model: str = "chat") -> bytes:
    return b"".join(json.dumps({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": f"batchline {tag} {i}"}]}
    }).encode() + b"\n" for i in range(n))


def upload(c: openai.OpenAI, data: bytes) -> str:
    return c.files.create(file=("input.jsonl", io.BytesIO(data)), purpose="batch").id


def finished(c: openai.OpenAI, batch_id: str) -> Any:
    return eventually(lambda: (b := c.batches.retrieve(batch_id)).status in ("completed", "cancelled", "failed",
                                                                             "expired") and b, timeout=240,
                      what=f"batch {batch_id} finished")


def test_openai_sdk_batch_round_trip(router: Router) -> None:
    c = router.client()
    fid = upload(c, jsonl(5))
    assert c.files.retrieve(fid).purpose == "batch"
    batch = c.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h",
                             metadata={"job": "nightly"})
    assert batch.status in ("validating", "in_progress") and batch.request_counts.total == 5
    done = finished(c, batch.id)
    assert done.status == "completed" and done.metadata == {"job": "nightly"}
    assert done.request_counts.completed == 5 and done.request_counts.failed == 0
    assert done.output_file_id and done.error_file_id is None
    lines = [json.loads(x) for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(x["custom_id"] for x in lines) == [f"line-{i}" for i in range(5)]
    assert all(x["response"]["status_code"] == 200 and x["response"]["body"]["object"] == "chat.completion"
               for x in lines)
    assert [b.id for b in c.batches.list()] == [batch.id]
    assert router.metric("oculis_batch_lines_total", route="chat", outcome="ok") == 5
    spent = sum((x["response"]["body"]["usage"]["prompt_tokens"] * 1.0
                 + x["response"]["body"]["usage"]["completion_tokens"] * 2.0) / 1e6 for x in lines)
    assert router.metric("oculis_batch_cost_dollars_total", route="chat", upstream="llama") == pytest.approx(spent)
    assert router.metric("oculis_flow_dispatches_total", priority="-101") == 5  # all at the batch priority
    assert c.files.delete(fid).deleted
    with pytest.raises(openai.NotFoundError):
        c.files.retrieve(fid)


def test_tenants_never_see_each_others_files_or_batches(router: Router) -> None:
    a, b, a_team = router.client("key-a"), router.client("key-b"), router.client("key-a", tenant="team2")
    fid = upload(a, jsonl(1))
    batch = a.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
    for other in (b, a_team):  # another key, and the same key under another tenant header
        with pytest.raises(openai.NotFoundError):
            other.files.retrieve(fid)
        with pytest.raises(openai.NotFoundError):
            other.files.content(fid)
        with pytest.raises(openai.NotFoundError):
            other.batches.retrieve(batch.id)
        with pytest.raises(openai.NotFoundError):
            other.batches.cancel(batch.id)
        with pytest.raises(openai.NotFoundError):  # a batch naming another tenant's file
            other.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
        assert list(other.batches.list()) == [] and list(other.files.list()) == []
    assert finished(a, batch.id).status == "completed"


def test_bad_input_is_refused_naming_the_line_and_field(router: Router) -> None:
    c = router.client()
    with pytest.raises(openai.BadRequestError) as e:
        upload(c, jsonl(2) + b"this is not json\n")
    assert "line 3" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        upload(c, jsonl(101))
    assert "100" in str(e.value) and "max_requests_per_batch" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        upload(c, jsonl(2) + jsonl(1))  # line-0 twice
    assert "line 3" in str(e.value) and "custom_id" in str(e.value)
    with pytest.raises(openai.APIStatusError) as big:
        upload(c, b"x" * (70 * 1024))
    assert big.value.status_code in (400, 413) and "max_file_bytes" in str(big.value)
    fid = upload(c, jsonl(2) + jsonl(1, tag="other", model="no-such-route"))
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
    assert "line 3" in str(e.value) and "no-such-route" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
    assert "completion_window" in str(e.value)


@pytest.mark.parametrize("router", [{"concurrency": 1}], indirect=True)
def test_cancel_stops_a_running_batch_and_keeps_what_it_answered(router: Router) -> None:
    c = router.client()
    batch = c.batches.create(input_file_id=upload(c, jsonl(60, max_tokens=20)), endpoint="/v1/chat/completions",
                             completion_window="24h")
    eventually(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 1, what="a line answered")
    assert c.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    done = finished(c, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    answered = done.request_counts.completed
    assert 1 <= answered < 60
    assert len(c.files.content(done.output_file_id).text.splitlines()) == answered


def test_a_router_killed_mid_batch_resumes_it_with_each_line_recorded_once(router: Router) -> None:
    c = router.client()
    batch = c.batches.create(input_file_id=upload(c, jsonl(40, max_tokens=20)), endpoint="/v1/chat/completions",
                             completion_window="24h")
    eventually(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 3, what="some lines answered")
    router.stop(kill=True)
    router.start()
    c = router.client()
    done = finished(c, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 40
    ids = [json.loads(x)["custom_id"] for x in c.files.content(done.output_file_id).text.splitlines()]
    assert sorted(ids) == sorted(f"line-{i}" for i in range(40))  # none lost, none twice


def test_interactive_requests_go_before_waiting_batch_lines(router: Router) -> None:
    c = router.client()
    stop = threading.Event()
    started = threading.Event()

    def blocker() -> None:  # holds the only seat until told to let go
        body = {"model": "chat", "max_tokens": 6000, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, timeout=120) as resp:
            for _ in resp.iter_lines():
                started.set()
                if stop.is_set():
                    return

    t = threading.Thread(target=blocker, daemon=True)
    t.start()
    assert started.wait(60)
    batch = c.batches.create(input_file_id=upload(c, jsonl(6)), endpoint="/v1/chat/completions",
                             completion_window="24h")
    eventually(lambda: router.metric("oculis_flow_queue_length", priority="-101") == 2, what="batch lines queued")
    with ThreadPoolExecutor(3) as pool:
        asks = [pool.submit(c.chat.completions.create, model="chat", max_tokens=3,
                            messages=[{"role": "user", "content": f"interactive {i}"}]) for i in range(3)]
        eventually(lambda: router.metric("oculis_flow_queue_length", priority="0") == 3, what="interactive queued")
        stop.set()
        t.join(120)
        assert all(f.result().choices for f in asks)
    assert finished(c, batch.id).status == "completed"
    served = [("interactive" if "interactive" in line else "batch") for line in router.decisions.read_text()
              .splitlines() if "interactive" in line or "batchline" in line]
    assert served == ["interactive"] * 3 + ["batch"] * 6, served


def test_an_unusable_store_is_a_loud_503_while_interactive_requests_flow(router: Router) -> None:
    store = router.tmp / "batches"
    store.write_text("not a directory")  # (as root a permission would not bind: a file where the folder goes)
    c = router.client()
    with pytest.raises(openai.APIStatusError) as e:
        upload(c, jsonl(1))
    assert e.value.status_code == 503 and "batch store" in str(e.value)
    assert c.chat.completions.create(model="chat", max_tokens=2,
                                     messages=[{"role": "user", "content": "still here"}]).choices


# ---- state in Redis: replicas share batches, a restart loses and repeats nothing -------------------------

def batch_prompts(*routers: Router) -> list[str]:
    """Every batch line the routers sent upstream (their decision logs), as the prompt's tag."""
    return [m.group(1) for r in routers if r.decisions.exists()
            for line in r.decisions.read_text().splitlines() if (m := re.search(r"batchline (\w+ \d+)", line))]


def test_two_routers_on_one_redis_run_each_line_of_a_batch_exactly_once(tmp_path: Path, sim: str,
                                                                        redis: RedisServer) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Router(tmp_path / "a", sim, concurrency=2, redis_url=redis.url)
    b = Router(tmp_path / "b", sim, concurrency=2, redis_url=redis.url)
    try:
        c = a.client()
        batch = c.batches.create(input_file_id=upload(c, jsonl(100, max_tokens=40)),
                                 endpoint="/v1/chat/completions", completion_window="24h")
        # the other replica finds the open batch in Redis and takes lines no one holds
        eventually(lambda: b.metric("oculis_batch_lines_total") >= 1, timeout=120, what="router b ran a line")
        done = finished(b.client(), batch.id)  # either replica answers for it
        assert done.status == "completed" and done.request_counts.completed == 100
        ids = [json.loads(x)["custom_id"] for x in c.files.content(done.output_file_id).text.splitlines()]
        assert sorted(ids) == sorted(f"line-{i}" for i in range(100))
        sent = batch_prompts(a, b)
        assert sorted(sent) == sorted(f"line {i}" for i in range(100)), "each line sent upstream exactly once"
        assert a.metric("oculis_batch_lines_total") + b.metric("oculis_batch_lines_total") == 100
        assert a.metric("oculis_batch_lines_total") >= 1
    finally:
        a.stop()
        b.stop()


def test_a_router_on_redis_killed_mid_batch_resumes_with_nothing_lost_or_twice(tmp_path: Path, sim: str,
                                                                               redis: RedisServer) -> None:
    r = Router(tmp_path, sim, concurrency=2, redis_url=redis.url)
    try:
        c = r.client()
        batch = c.batches.create(input_file_id=upload(c, jsonl(40, max_tokens=20)),
                                 endpoint="/v1/chat/completions", completion_window="24h")
        eventually(lambda: c.batches.retrieve(batch.id).request_counts.completed >= 3, what="some lines answered")
        r.stop(kill=True)  # its claimed lines are freed once its lease expires; the new process takes them
        r.start()
        c = r.client()
        done = finished(c, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 40
        assert done.request_counts.failed == 0
        ids = [json.loads(x)["custom_id"] for x in c.files.content(done.output_file_id).text.splitlines()]
        assert sorted(ids) == sorted(f"line-{i}" for i in range(40))  # none lost, none recorded twice
        assert set(batch_prompts(r)) == {f"line {i}" for i in range(40)}
    finally:
        r.stop()


def test_redis_down_makes_batch_creation_a_503_naming_it_while_chat_flows(tmp_path: Path, sim: str,
                                                                         redis: RedisServer) -> None:
    r = Router(tmp_path, sim, redis_url=redis.url)
    try:
        c = r.client()
        fid = upload(c, jsonl(2))
        redis.stop()
        with pytest.raises(openai.APIStatusError) as e:
            c.batches.create(input_file_id=fid, endpoint="/v1/chat/completions", completion_window="24h")
        assert e.value.status_code == 503
        assert f"Redis at redis://127.0.0.1:{redis.port}/0" in str(e.value) and "batch store" in str(e.value)
        assert c.chat.completions.create(model="chat", max_tokens=2,
                                         messages=[{"role": "user", "content": "still here"}]).choices
    finally:
        r.stop()


def test_a_cancel_through_one_replica_stops_the_batch_on_both(tmp_path: Path, sim: str, redis: RedisServer) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = Router(tmp_path / "a", sim, concurrency=1, redis_url=redis.url)
    b = Router(tmp_path / "b", sim, concurrency=1, redis_url=redis.url)
    try:
        c = a.client()
        batch = c.batches.create(input_file_id=upload(c, jsonl(100, max_tokens=40)),
                                 endpoint="/v1/chat/completions", completion_window="24h")
        eventually(lambda: b.metric("oculis_batch_lines_total") >= 1 and a.metric("oculis_batch_lines_total") >= 1,
                   timeout=120, what="both replicas ran a line")
        assert b.client().batches.cancel(batch.id).status in ("cancelling", "cancelled")
        done = finished(c, batch.id)
        assert done.status == "cancelled"
        answered = done.request_counts.completed
        assert 2 <= answered < 100
        ids = [json.loads(x)["custom_id"] for x in c.files.content(done.output_file_id).text.splitlines()]
        assert len(ids) == len(set(ids)) == answered  # every line its counts say, once
        assert len(batch_prompts(a, b)) == answered  # and nothing sent upstream beyond them
    finally:
        a.stop()
        b.stop()
