"""Helpers shared by the e2e tests (kept out of conftest so test modules can import them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

E2E = Path(__file__).resolve().parents[1]
CLUSTER = E2E / "cluster"
T = TypeVar("T")
# The cluster tool's own module, for tests that need its helpers (ports) rather than its CLI.
sys.path.insert(0, str(E2E))
import localcluster as localcluster  # noqa: E402  (re-exported)

# Every wait of the suite scales in one place (tests/suite/time_scale.py: OCULIS_TEST_TIME_SCALE and load).
sys.path.insert(1, str(E2E.parent / "tests" / "suite"))
from time_scale import Deadline, scaled  # noqa: E402

__all__ = ["CLUSTER", "E2E", "Deadline", "eventually", "localcluster", "oculis_serve", "scaled", "serve_pods"]


def eventually(probe: Callable[[], T], timeout: float = 60, interval: float = 0.25, what: str = "") -> T:
    """Call `probe` until it returns a truthy value without raising; fail with the last state. `timeout` is
    the wait on an idle machine: it stretches with the machine (time_scale.Deadline)."""
    deadline = Deadline(timeout)
    last: Any = None
    while True:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # the probe's own assertion or a 404 while the object appears
            last = exc
        if deadline.expired():
            pytest.fail(f"timed out after {deadline.describe()} waiting for {what or probe}: last {last!r}",
                        pytrace=False)
        time.sleep(interval)


@contextlib.contextmanager
def serve_pods(namespace: str) -> Iterator[dict[str, Any]]:
    """The namespace's pods served by simulated engines (`e2e/cluster serve-pods`) and scraped by a real
    Prometheus, for as long as the block runs; yields the tool's file map (its last stdout line)."""
    proc = subprocess.run([str(CLUSTER), "serve-pods", f"--namespace={namespace}"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    files: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert files["prometheus"], "prometheus did not start"
    try:
        yield files
    finally:
        subprocess.run([str(CLUSTER), "serve-pods", "--stop"], capture_output=True, check=False)


def engine_auth(endpoints: Path | str, upstream_or_host: str) -> dict[str, str]:
    """The Authorization header a sandbox engine pod of this upstream (or Service host, `<name>-vllm[-canary].
    <ns>.svc`) takes: its API key as the pod stand-in wrote it beside its endpoint map; {} when there is none
    (spec.access.apiKey false, or the pod not started yet)."""
    name = upstream_or_host.split(".")[0].removesuffix("-canary").removesuffix("-vllm")
    try:
        key = (Path(endpoints).parent / "engine-keys" / name).read_text().strip()
    except OSError:
        return {}
    return {"Authorization": f"Bearer {key}"} if key else {}


@contextlib.contextmanager
def oculis_serve(config: Path, endpoints: Path | str, log: Path, port: int, metrics_port: int = 0) -> Iterator[str]:
    """`oculis serve` on `config` (a router config the operator rendered), reaching the stand-in's pods
    through its endpoint map, with the engines' API keys where the stand-in writes them (as the chart mounts
    the Secret oculis-engine-keys); yields the router's URL once /readyz answers 200, and stops it after."""
    env = {**os.environ, "OCULIS_ENGINE_KEYS_DIR": str(Path(endpoints).parent / "engine-keys")}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("oculis")), "serve", "--config", str(config),
                                 "--endpoints", str(endpoints), "--port", str(port), "--metrics-port",
                                 str(metrics_port), "--log-level", "warning"],
                                stdout=out, stderr=out, start_new_session=True, env=env)
        try:
            url = f"http://127.0.0.1:{port}"
            eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200, what="router ready")
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)

