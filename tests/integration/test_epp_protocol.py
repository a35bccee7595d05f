"""`oculis epp` driven over gRPC as a proxy drives it (the GIE endpoint-picker protocol), in front of real
`oculis sim serve` replicas: the protocol's parts plain Envoy does not exercise (a subset hint, a fallback list,
the served-endpoint metadata, shedding with 429) and gRPC health, message by message."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from e2e_support import eventually
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc
from epp_support import health
from fake_upstreams import free_port
from google.protobuf import struct_pb2
from prometheus_client.parser import text_string_to_metric_families
from sim_support import stop_all, wait_healthy

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]
DEST, SERVED = "x-gateway-destination-endpoint", "x-gateway-destination-endpoint-served"


def start_sim(port: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
                             "--host", "127.0.0.1", "--port", str(port), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_epp(tmp: Path, urls: list[str], *args: str) -> tuple[subprocess.Popen[bytes], int, str]:
    cfg = tmp / f"epp-{len(args)}.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [{
        "name": "llama", "provider": "vllm", "model": MODEL, "picker": "round-robin",
        "endpoints": [u + "/v1" for u in urls]}]}}))
    port, mport = free_port(), free_port()
    log = tmp / f"epp-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "epp", "--config", str(cfg), "--upstream",
                                 "llama", "--port", str(port), "--metrics-port", str(mport), *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()
        return health(port, "readiness") == "SERVING"

    eventually(ready, timeout=90, what="oculis epp readiness")
    return proc, port, f"http://127.0.0.1:{mport}/metrics"


class Stream:
    """One ext_proc stream, as a proxy holds it: messages sent one by one, answers read as they come."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.out: queue.Queue[ep.ProcessingRequest | None] = queue.Queue()
        self.answers = ep_grpc.ExternalProcessorStub(self.channel).Process(iter(self.out.get, None), timeout=60)

    def send(self, req: ep.ProcessingRequest) -> None:
        self.out.put(req)

    def read(self) -> ep.ProcessingResponse:
        return next(self.answers)

    def close(self) -> None:
        self.out.put(None)
        self.channel.close()


def headers(path: str = "/v1/chat/completions", subset: list[str] | None = None) -> ep.ProcessingRequest:
    hmap = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=":path", raw_value=path.encode()),
                                       base_pb2.HeaderValue(key=":method", raw_value=b"POST")])
    req = ep.ProcessingRequest(request_headers=ep.HttpHeaders(headers=hmap))
    if subset is not None:
        hint = struct_pb2.Struct()
        hint.update({"x-gateway-destination-endpoint-subset": subset})
        req.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(hint)
    return req


def body(payload: dict[str, Any], end: bool = True) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=json.dumps(payload).encode(), end_of_stream=end))


CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def pick(port: int, subset: list[str] | None = None) -> tuple[ep.ProcessingResponse, ep.ProcessingResponse | None]:
    s = Stream(port)
    try:
        s.send(headers(subset=subset))
        s.send(body(CHAT))
        first = s.read()
        return first, None if first.HasField("immediate_response") else s.read()
    finally:
        s.close()


def destination(resp: ep.ProcessingResponse) -> str:
    hdr = {h.header.key: h.header.raw_value.decode() for h in resp.request_headers.response.header_mutation.set_headers}
    meta = resp.dynamic_metadata.fields["envoy.lb"].struct_value.fields[DEST].string_value
    assert hdr[DEST] == meta  # the protocol: identical in the header and the metadata
    return meta


def metric(url: str, name: str) -> float:
    text = httpx.get(url, timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.fixture(scope="module")
def sims() -> Iterator[list[str]]:
    ports = [free_port(), free_port()]
    procs = [start_sim(p) for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    try:
        wait_healthy(urls)
        yield urls
    finally:
        stop_all(procs)


def test_fallback_list_subset_hint_served_endpoint_and_health(sims: list[str], tmp_path: Path) -> None:
    proc, port, metrics = start_epp(tmp_path, sims, "--fallbacks", "1")
    addrs = [u.removeprefix("http://") for u in sims]
    try:
        assert {health(port, s) for s in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")} \
            == {"SERVING"}
        first, rest = pick(port)
        listed = destination(first).split(",")
        assert sorted(listed) == sorted(addrs)  # the pick, then the other replica to fall back to
        assert first.request_headers.response.clear_route_cache
        assert rest is not None and rest.request_body.response.body_mutation.streamed_response.end_of_stream
        assert json.loads(rest.request_body.response.body_mutation.streamed_response.body) == CHAT
        # A subset hint narrows the choice to its endpoints; one naming none of the replicas is a 503.
        for _ in range(4):
            assert destination(pick(port, subset=[addrs[1]])[0]) == addrs[1]
        refused, _ = pick(port, subset=["127.0.0.2:9"])
        assert refused.immediate_response.status.code == 503
        assert json.loads(refused.immediate_response.body)["error"]["code"] == "no_replica"
        # The response path: the proxy says another endpoint served (it moved down the list); the pick is
        # set aside, so the next picks go to the other replica.
        s = Stream(port)
        s.send(headers())
        s.send(body(CHAT))
        picked = destination(s.read()).split(",")[0]
        s.read()
        served = base_pb2.Metadata()
        lb = struct_pb2.Struct()
        other = next(a for a in addrs if a != picked)
        lb.update({SERVED: other})
        served.filter_metadata["envoy.lb"].CopyFrom(lb)
        s.send(ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200")])), metadata_context=served))
        assert s.read().HasField("response_headers")
        # a proxy that streams the response body through the picker (FULL_DUPLEX_STREAMED) gets it back as sent
        for piece, end in ((b"data: {}\n\n", False), (b"data: [DONE]\n\n", True)):
            s.send(ep.ProcessingRequest(response_body=ep.HttpBody(body=piece, end_of_stream=end)))
            back = s.read().response_body.response.body_mutation.streamed_response
            assert (back.body, back.end_of_stream) == (piece, end)
        s.close()
        assert metric(metrics, "oculis_epp_served_elsewhere_total") == 1
        assert {destination(pick(port)[0]).split(",")[0] for _ in range(3)} == {other}
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_every_replica_queueing_past_the_bound_is_shed_with_429(tmp_path: Path) -> None:
    port = free_port()
    sim = start_sim(port, "--max-num-seqs", "1")
    url = f"http://127.0.0.1:{port}"
    epp = None
    stop = threading.Event()
    try:
        wait_healthy([url])
        epp, eport, _ = start_epp(tmp_path, [url], "--shed-waiting", "1")
        long = {**CHAT, "max_tokens": 4000, "ignore_eos": True, "stream": True}

        def hold() -> None:  # one runs, the next waits in the engine's queue
            with httpx.stream("POST", url + "/v1/chat/completions", json=long, timeout=120) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return

        threads = [threading.Thread(target=hold, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        # within a probe (1 s) of the engine saying so, the picker sheds
        eventually(lambda: pick(eport)[0].immediate_response.status.code == 429, timeout=60, what="a 429")
        refused, _ = pick(eport)
        assert json.loads(refused.immediate_response.body)["error"]["code"] == "overloaded"
        assert {h.header.key for h in refused.immediate_response.headers.set_headers} >= {"retry-after"}
        stop.set()
    finally:
        stop.set()
        if epp is not None:
            epp.terminate()
            epp.wait(timeout=15)
        stop_all([sim])
