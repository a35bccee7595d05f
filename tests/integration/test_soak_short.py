"""The router soak (bench/soak.py) for 60 s: two `oculis serve` replicas over a shared Redis, engine
simulators behind fault proxies (10 % of calls faulted), Redis restarted, the config reloaded every
10 s (one broken file), one replica SIGTERMed and restarted. It must lose nothing, hang nothing,
answer no 5xx without a cause, log no traceback or secret, keep RSS and fds flat and count every
request once. Marked `soak`: `-m soak` selects it, `-m "not soak"` leaves it out."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

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
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_router_soak_under_faults_loses_nothing() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--duration", "60", "--reload-every",
                           "10", "--deadline", "20", "--rate", "10", "--burst", "30"],
                          capture_output=True, text=True, timeout=150, cwd=ROOT)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "\nPASS" in proc.stdout
