"""`oculis serve` through its life: it may start before its config exists (not ready until the
file appears), and a rolling restart never cuts an answer short: on SIGTERM it stops taking new
connections, lets in-flight streams finish, then exits cleanly."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from router_support import Fakes, start_router
from time_scale import Deadline


def test_sigterm_lets_an_inflight_stream_finish(fakes: Fakes, tmp_path: Path) -> None:
    script = fakes.scripts["small"]
    script.reply = "one two three four five six seven eight"
    script.stream_delay = 0.25  # ~2 s of streaming after the first chunk
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(fakes.config()))
    proc, url, _ = start_router(path, tmp_path / "router.log", "--shutdown-grace", "30")
    first_chunk = threading.Event()
    chunks: list[str] = []

    def stream() -> None:
        body = {"model": "llama-8b", "stream": True, "messages": [{"role": "user", "content": "count"}]}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
                    first_chunk.set()

    reader = threading.Thread(target=stream)
    reader.start()
    try:
        assert first_chunk.wait(10), (tmp_path / "router.log").read_text()
        proc.send_signal(signal.SIGTERM)
        reader.join(30)
        # uvicorn re-raises the captured SIGTERM once it has shut down gracefully.
        assert proc.wait(30) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Finished server process" in (tmp_path / "router.log").read_text()
    assert chunks[-1] == "[DONE]"
    events = [json.loads(c) for c in chunks[:-1]]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    assert text.split() == ["one", "two", "three", "four", "five", "six", "seven", "eight", "from", "small"]
    with pytest.raises(httpx.ConnectError):  # gone: new requests go to the other replicas
        httpx.get(url + "/readyz", timeout=2)


def test_taken_port_and_bad_grace_are_one_line_errors(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "c.yaml"
    path.write_text("oculis:\n  upstreams: [{name: a, provider: vllm, base_url: 'http://127.0.0.1:9/v1', model: m}]\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path),
                               "--port", str(taken)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"--port {taken}: 127.0.0.1:{taken} is already in use" in proc.stderr
    for args, says in ((["--port", "70000"], "'70000' is not a port"),
                       (["--client-keys-env", "NOT-A-VAR"], "is not an environment variable name"),
                       (["--shutdown-grace", "-1"], "--shutdown-grace -1 is negative")):
        proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path), *args],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr


def test_started_before_its_config_it_waits_then_serves(fakes: Fakes, tmp_path: Path) -> None:
    path = tmp_path / "config" / "oculis-config.yaml"  # not there yet: the ConfigMap has no route yet
    proc, url, _ = start_router(path, tmp_path / "router.log", "--wait-for-config", probe="/healthz")
    try:
        ready = httpx.get(url + "/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "waiting for config"
        r = httpx.post(url + "/v1/chat/completions",
                       json={"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_config"
        path.parent.mkdir()
        path.write_text(yaml.safe_dump(fakes.config()))
        deadline = Deadline(15)
        while httpx.get(url + "/readyz").status_code != 200:
            assert not deadline.expired(), (tmp_path / "router.log").read_text()
            time.sleep(0.2)
        r = httpx.post(url + "/v1/chat/completions",
                       json={"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200 and r.headers["x-oculis-tier"] == "simple"
    finally:
        proc.terminate()
        proc.wait(30)


def test_without_wait_for_config_a_missing_file_is_refused(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(tmp_path / "none.yaml")],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "cannot read config" in proc.stderr and "Traceback" not in proc.stderr


def test_client_keys_env_flag_guards_a_router_whose_config_has_none(
        fakes: Fakes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a cluster the rendered config has no server block: the chart passes the flag and a Secret-backed variable.
    monkeypatch.setenv("OCULIS_TEST_CLIENT_KEYS", "sk-client")
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(fakes.config()))
    proc, url, _ = start_router(path, tmp_path / "router.log", "--client-keys-env", "OCULIS_TEST_CLIENT_KEYS")
    try:
        body = {"model": "adaptive", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401
        ok = httpx.post(url + "/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-client"})
        assert ok.status_code == 200
    finally:
        proc.terminate()
        proc.wait(30)
