"""The kv-events picker over real ZMQ: two replicas publish vLLM-format KV events (msgpack over ZMQ PUB);
two real router processes subscribe to both. The replica whose events say it holds the prompt's blocks
gets the prompt from either router (one view); once it reports the blocks removed, the affinity is
gone. A replica that publishes nothing is scored from the router's own memory (reason `fallback`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
import zmq
from fake_upstreams import Script, Server, openai_app
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router
from time_scale import Deadline

from oculis_router.picking import BlockRemoved, BlockStored, EventBatch, chat_token_ids, kvwire

BS = 16
MESSAGES = [{"role": "system", "content": " ".join(f"policy{i}" for i in range(200))},
            {"role": "user", "content": "what does clause 7 say"}]


def _port(base: int) -> int:
    p = base
    while True:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                return p
            except OSError:
                p += 1


class Publisher:
    """An engine's KV-event publisher: re-sends its current batch every 50 ms (ZMQ PUB drops what is
    sent before a subscriber has joined)."""

    def __init__(self, port: int) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUB)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.address = f"tcp://127.0.0.1:{port}"
        self.batch = EventBatch(0.0, ())
        self.seq = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.seq += 1
            self.sock.send_multipart(kvwire.encode("kv-events", self.seq, self.batch))
            time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[list[Server], list[Publisher], Path]]:
    servers = [Server(openai_app(f"r{i}", Script())) for i in range(3)]
    for s in servers:
        s.__enter__()
    pubs = [Publisher(_port(36300 + 10 * i)) for i in range(2)]
    cfg = tmp_path / "config.yaml"
    endpoints = [{"url": servers[i].url + "/v1", "kv_events": pubs[i].address} for i in range(2)]
    endpoints.append({"url": servers[2].url + "/v1"})  # publishes nothing
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [
        {"name": "llama", "provider": "vllm", "model": "m", "picker": "kv-events", "endpoints": endpoints}]}}))
    try:
        yield servers, pubs, cfg
    finally:
        for p in pubs:
            p.close()
        for s in servers:
            s.__exit__(None, None, None)


def _ask(url: str) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=30,
                   json={"model": "llama", "messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.headers["x-oculis-replica"]


def _applied(mport: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{mport}/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "oculis_kv_event_batches_total" and s.labels["outcome"] == "applied")


def test_two_routers_follow_the_engines_kv_events(world: tuple[list[Server], list[Publisher], Path],
                                                  tmp_path: Path) -> None:
    servers, pubs, cfg = world
    ids = chat_token_ids(MESSAGES)
    n = len(ids) // BS
    hashes = tuple(range(1000, 1000 + n))
    stored = BlockStored(hashes, None, tuple(ids[:n * BS]), BS)
    pubs[1].batch = EventBatch(1.0, (stored,))  # replica 1 holds the whole prompt; replica 0 holds nothing
    routers = [start_router(cfg, tmp_path / f"router{i}.log") for i in range(2)]
    try:
        for _, _, mport in routers:
            deadline = Deadline(20)
            while _applied(mport) < 4 and not deadline.expired():
                time.sleep(0.1)
        holder = servers[1].url + "/v1"
        for _ in range(3):
            assert [_ask(url) for _, url, _ in routers] == [holder, holder]  # one view from both routers
        # The engine evicts the blocks: the affinity goes with them (on both routers).
        pubs[1].batch = EventBatch(2.0, (BlockRemoved(hashes),))
        time.sleep(1.0)
        picks = {_ask(url) for _ in range(6) for _, url, _ in routers}
        assert picks != {holder}  # spread by load again
        text = httpx.get(f"http://127.0.0.1:{routers[0][2]}/metrics").text
        reasons = {s.labels["reason"] for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "oculis_picks_total"}
        assert "prefix" in reasons
    finally:
        for proc, _, _ in routers:
            proc.terminate()
            proc.wait(timeout=10)
    log = (tmp_path / "router0.log").read_text()
    assert "scores replica " + servers[2].url + "/v1 from the router's prefix memory (fallback)" in log
