"""`oculis serve --redis-url` (or $OCULIS_REDIS_URL): two router processes whose config has no server
section, as the operator renders it, share the response cache and the rate limits through Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
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
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = Deadline(10)
    while not deadline.expired() and subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() != "PONG":
        time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)


def ask(url: str, content: str) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", headers={"authorization": "Bearer sk-client"}, timeout=30,
                      json={"model": "adaptive", "temperature": 0, "messages": [{"role": "user", "content": content}]})


def test_redis_url_flag_and_env_share_cache_and_limits_across_replicas(
        fakes: Fakes, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = fakes.config(limits={"requests_per_minute": 2, "per": "key"})
    assert "server" not in cfg["oculis"]  # what the operator renders: no cache_backend, no redis_url
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    a, url_a, _ = start_router(path, tmp_path / "a.log", "--redis-url", redis_url)
    monkeypatch.setenv("OCULIS_REDIS_URL", redis_url)  # the chart's way: the environment
    b, url_b, _ = start_router(path, tmp_path / "b.log")
    try:
        first = ask(url_a, "shared answer please")
        assert first.status_code == 200 and first.headers["x-oculis-cache"] == "miss"
        second = ask(url_b, "shared answer please")
        assert second.headers["x-oculis-cache"] == "hit"  # the other process's answer, from Redis
        # The two requests above counted in Redis: a third to either replica is over 2 per minute.
        assert ask(url_a, "a new question").status_code == 429
        assert ask(url_b, "another new question").status_code == 429
    finally:
        for p in (a, b):
            p.terminate()
            p.wait(10)


@pytest.mark.parametrize(("url", "words"), [
    ("http://redis:6379/0", "the scheme must be one of redis://"),
    ("redis://:hunter2@:6379/0", "names no host"),
    ("redis://redis:port/0", "Port could not be cast"),
])
def test_unusable_redis_url_is_one_line_before_serving_and_hides_the_password(
        tmp_path: Path, url: str, words: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("oculis:\n  upstreams: []\n  routes: []\n")
    env = {k: v for k, v in os.environ.items() if k != "OCULIS_REDIS_URL"}
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path), "--port",
                           str(free_port()), "--metrics-port", "0", "--redis-url", url],
                          capture_output=True, text=True, timeout=30, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("oculis serve: --redis-url") and proc.stderr.count("\n") == 1, proc.stderr
    assert words in proc.stderr and "hunter2" not in proc.stderr, proc.stderr
