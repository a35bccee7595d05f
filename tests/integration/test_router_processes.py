"""`oculis serve` as real processes: a Redis-backed cache shared by two routers, Prometheus text on
the metrics port, and no secret in logs or metrics."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml
from fake_upstreams import free_port
from router_support import Fakes, start_router
from skips import needs_command
from time_scale import Deadline

pytestmark = needs_command("redis-server", "redis-server")


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            "64mb",
            "--maxmemory-policy",
            "allkeys-lru",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = Deadline(10)
    while not deadline.expired():
        if (
            subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip()
            == "PONG"
        ):
            break
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


def test_two_routers_share_the_redis_cache_and_expose_metrics(fakes: Fakes, redis_url: str, tmp_path: Path) -> None:
    cfg = fakes.config()
    cfg["oculis"]["server"] = {"cache_backend": "redis", "redis_url": redis_url}
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    a, url_a, metrics_a = start_router(path, tmp_path / "a.log")
    b, url_b, _ = start_router(path, tmp_path / "b.log")
    try:
        msg = [{"role": "user", "content": "shared answer please"}]
        ca = openai.OpenAI(base_url=url_a + "/v1", api_key="sk-client", max_retries=0)
        cb = openai.OpenAI(base_url=url_b + "/v1", api_key="sk-client", max_retries=0)
        first = ca.chat.completions.with_raw_response.create(model="adaptive", messages=msg, temperature=0)
        assert first.headers["x-oculis-cache"] == "miss"
        second = cb.chat.completions.with_raw_response.create(model="adaptive", messages=msg, temperature=0)
        assert second.headers["x-oculis-cache"] == "hit"  # served by the other process, from Redis
        assert len(fakes.scripts["small"].received) == 1
        ca.chat.completions.create(model="gpt4o", messages=msg)
        fakes.scripts["small"].fail_times = 100  # failures get logged: the logs must still hold no secret
        ca.chat.completions.create(model="adaptive", messages=[{"role": "user", "content": "fail over"}])
        text = httpx.get(f"http://127.0.0.1:{metrics_a}/metrics").text
        assert 'oculis_requests_total{outcome="ok",route="adaptive",tier="simple",upstream="llama-8b"} 1.0' in text
        assert 'oculis_escalations_total{reason="upstream_error",route="adaptive"} 1.0' in text
        assert 'oculis_cache_lookups_total{result="miss",route="adaptive"}' in text
    finally:
        for p in (a, b):
            p.terminate()
            p.wait(10)
    logs = (tmp_path / "a.log").read_text() + (tmp_path / "b.log").read_text()
    assert "escalating past llama-8b" in logs
    assert "SECRET" not in logs and "SECRET" not in text and "sk-client" not in logs


def test_bad_config_file_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("oculis:\n  upstreams: [{name: a, provider: vllm}]\n")
    proc = subprocess.run(
        [sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "provider vllm needs base_url" in proc.stderr and "Traceback" not in proc.stderr
