"""A real `oculis sim serve` process for tests: started on a free 127.0.0.1 port, waited for until /health
answers, its output in a log file (shown if it exits early)."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import httpx
from e2e_support import eventually
from fake_upstreams import free_port

ROOT = Path(__file__).resolve().parents[2]


def ports_from(base: int, n: int) -> list[int]:
    """The first `n` ports from `base` up that are free on 127.0.0.1 (a suite's own port range)."""
    ports: list[int] = []
    p = base
    while len(ports) < n:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
                ports.append(p)
            except OSError:
                pass
        p += 1
    return ports


def healthy(url: str) -> bool:
    """Whether the engine at `url` answers /health."""
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def wait_healthy(urls: Iterable[str], timeout: float = 60) -> None:
    for url in urls:
        eventually(lambda u=url: healthy(u), timeout=timeout, what=f"{url}/health")


def stop_all(procs: Iterable[subprocess.Popen[bytes]]) -> None:
    """Terminate every process, then wait for each (they stop in parallel)."""
    procs = list(procs)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)


def start_sim(*args: str, log: Path | None = None, timeout: float = 30) -> tuple[subprocess.Popen[bytes], str]:
    """`oculis sim serve ARGS --host 127.0.0.1 --port P` (later --host/--port win over any in ARGS)."""
    port = free_port()
    log = log or Path(tempfile.mkstemp(prefix="oculis-sim-", suffix=".log")[1])
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", *args, "--host",
                                 "127.0.0.1", "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            return httpx.get(f"{base}/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    eventually(up, timeout=timeout, what="oculis sim serve answers /health")
    return proc, base


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)
