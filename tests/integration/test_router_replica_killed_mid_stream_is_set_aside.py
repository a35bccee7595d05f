"""A replica killed mid-stream is counted and set aside like any replica failure (QA3 Part 2 #23): the stream
ended correctly (an error event, no [DONE], outcome stream_broken), but oculis_replica_failures_total did not
move and the replica was not set aside, so the next request met the dead replica first. The real router in
front of a real `oculis sim serve` that is SIGKILLed after the first chunks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import yaml
from e2e_support import eventually
from prometheus_client.parser import text_string_to_metric_families
from router_support import start_router
from sim_support import healthy, ports_from

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_a_replica_killed_mid_stream_counts_as_a_replica_failure(tmp_path: Path) -> None:
    port = ports_from(36400, 1)[0]
    sim = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", MODEL, "--gpu", "H100-80GB",
                            "--host", "127.0.0.1", "--port", str(port)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {"upstreams": [
        {"name": "llama", "provider": "vllm", "model": MODEL, "endpoints": [url + "/v1"]}]}}))
    proc = None
    try:
        eventually(lambda: healthy(url), timeout=60, what="sim /health")
        proc, router, mport = start_router(cfg, tmp_path / "router.log")
        body = {"model": "llama", "max_tokens": 3000, "stream": True, "ignore_eos": True,
                "messages": [{"role": "user", "content": "tell me a long story"}]}
        lines: list[str] = []
        with httpx.stream("POST", router + "/v1/chat/completions", json=body, timeout=30) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                lines.append(line)
                if len(lines) == 3:
                    sim.kill()  # the replica vanishes mid-stream
        assert any("stream_interrupted" in line for line in lines[-3:]), lines[-3:]
        metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=10).text
    finally:
        sim.kill()
        sim.wait(timeout=10)
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    failures = {s.labels["replica"]: s.value for f in text_string_to_metric_families(metrics) for s in f.samples
                if s.name == "oculis_replica_failures_total"}
    assert failures == {url + "/v1": 1}, failures
    assert "set aside" in (tmp_path / "router.log").read_text()
