"""The router soak (bench/soak.py) for 60 s: two `oculis serve` replicas over a shared Redis, engine
simulators behind fault proxies (10 % of calls faulted), Redis restarted, the config reloaded every
10 s (one broken file), one replica SIGTERMed and restarted. It must lose nothing, hang nothing,
answer no 5xx without a cause, log no traceback or secret, keep RSS and fds flat and count every
request once. Marked `soak`: `-m soak` selects it, `-m "not soak"` leaves it out."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import openai
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import Server, free_port
from skips import needs_command

from oculis_router.app import build_app

ROOT = Path(__file__).resolve().parents[2]


def _soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak", ROOT / "bench" / "soak.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def _sse(*events: object) -> bytes:
    return b"".join(b"data: " + (e if isinstance(e, bytes) else json.dumps(e).encode()) + b"\n\n" for e in events)


def test_soak_tells_a_lost_answer_from_an_explained_one() -> None:
    classify = _soak().classify
    chunk = {"choices": [{"delta": {"content": "hi"}}]}
    err = {"error": {"message": "upstream cut", "type": "server_error", "param": None, "code": "stream_interrupted"}}
    assert classify(200, _sse(chunk, b"[DONE]"), True) == "ok"
    assert classify(200, _sse(chunk, err, b"[DONE]"), True) == "stream-error stream_interrupted"
    assert classify(200, _sse(chunk), True) == "lost truncated-stream"
    assert classify(200, _sse(chunk, b"{broken", b"[DONE]"), True) == "lost malformed-event"
    assert classify(200, b'{"choices": [{"message": {}}]}', False) == "ok"
    assert classify(200, b'{"choices": [{"mess', False) == "lost bad-json"
    assert classify(502, json.dumps({"error": {**err["error"], "code": "upstream_error"}}).encode(), False) \
        == "error 502 upstream_error"
    assert classify(500, json.dumps({"error": {**err["error"], "code": "internal"}}).encode(), False) \
        == "5xx-no-cause 500"
    assert classify(502, b"<html>Bad Gateway</html>", False) == "lost 502-not-openai-shaped"


@pytest.mark.soak
@needs_command("redis-server", "redis-server")
def test_router_soak_under_faults_loses_nothing() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--duration", "60", "--reload-every",
                           "10", "--deadline", "20", "--rate", "10", "--burst", "30",
                           # Two bursts in each quarter: the fd windows compare peak with peak (the upstream
                           # and Redis pools follow the concurrency, so a window without a burst reads low).
                           "--burst-every", "7"],
                          capture_output=True, text=True, timeout=150, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "\nPASS" in proc.stdout


@needs_command("redis-server", "redis-server")
def test_cache_reloads_do_not_pile_up_redis_connections(fakes: Any, tmp_path: Path) -> None:
    """Each reload that changes a route's cache makes a new store; one connection pool per store kept
    every dropped store's connections open for RETIRE_AFTER_S (the soak saw fds grow with each reload,
    and go CLOSE_WAIT when Redis restarted)."""
    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)

    def clients() -> int:
        out = subprocess.run(["redis-cli", "-p", str(port), "client", "list"], capture_output=True, text=True).stdout
        return sum(1 for line in out.splitlines() if "cmd=client" not in line and line.strip())

    try:
        eventually(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                          text=True).stdout.strip() == "PONG")
        path = tmp_path / "oculis-config.yaml"
        cfg = fakes.config()
        cfg["oculis"]["server"] = {"cache_backend": "redis", "redis_url": f"redis://127.0.0.1:{port}/0"}
        path.write_text(yaml.safe_dump(cfg))
        app = build_app(config_path=path, reload_interval=0.05)
        with Server(app) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-client", max_retries=0)
            for ttl in range(100, 108):
                cfg["oculis"]["routes"][0]["cache"]["ttl_seconds"] = ttl
                path.write_text(yaml.safe_dump(cfg))
                eventually(lambda ttl=ttl: app.state.holder.current.routes["adaptive"].route.cache.ttl_seconds == ttl)
                client.chat.completions.create(model="adaptive", temperature=0,
                                               messages=[{"role": "user", "content": f"hi {ttl}"}])
            assert clients() <= 2, f"{clients()} Redis connections after 8 reloads"
    finally:
        redis.terminate()
        redis.wait(10)


def _close_wait_to(port: int) -> int:
    """Sockets of this machine in CLOSE_WAIT towards `port` (the peer closed, we did not)."""
    rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for r in rows if int(r.split()[2].split(":")[1], 16) == port and r.split()[3] == "08")


@needs_command("redis-server", "redis-server")
def test_a_redis_restart_leaves_no_dead_connections_open(fakes: Any, tmp_path: Path) -> None:
    """A pool grown by concurrent requests kept every idle connection a restarted Redis had closed
    (CLOSE_WAIT) for good: it only notices the few it hands out again."""
    port = free_port()
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path)]

    def up() -> subprocess.Popen[bytes]:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
        eventually(lambda: subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                                          text=True).stdout.strip() == "PONG")
        return p

    redis = up()
    try:
        path = tmp_path / "oculis-config.yaml"
        cfg = fakes.config()
        cfg["oculis"]["server"] = {"cache_backend": "redis", "redis_url": f"redis://127.0.0.1:{port}/0",
                                   "limits": {"requests_per_minute": 100000}}
        path.write_text(yaml.safe_dump(cfg))
        fakes.scripts["small"].reply_delay = 0.3  # concurrent requests: the pools grow
        with Server(build_app(config_path=path)) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-client", max_retries=0)

            def ask(i: int) -> None:
                client.chat.completions.create(model="adaptive", temperature=0,
                                               messages=[{"role": "user", "content": f"hello {i}"}])

            with ThreadPoolExecutor(12) as pool:
                list(pool.map(ask, range(24)))
            redis.terminate()
            redis.wait(10)
            redis = up()
            fakes.scripts["small"].reply_delay = 0
            for i in range(30, 36):
                ask(i)
            assert eventually(lambda: _close_wait_to(port) == 0, timeout=5, what="CLOSE_WAIT sockets to Redis")
    finally:
        redis.terminate()
        redis.wait(10)
