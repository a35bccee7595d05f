"""A real `oculis sim serve` process for tests: started on a free 127.0.0.1 port, waited for until /health
answers, its output in a log file (shown if it exits early)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from e2e_support import eventually
from fake_upstreams import free_port

ROOT = Path(__file__).resolve().parents[2]


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
