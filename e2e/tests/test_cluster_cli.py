"""`e2e/cluster` itself: idempotent `up`, one-line causes for bad starts with no stray processes,
and `down` cleaning up after a crash."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import CLUSTER, eventually, localcluster
from time_scale import Deadline

PORT_NAMES = ("ETCD", "ETCD_PEER", "APISERVER", "CONTROLLER_MANAGER", "SCHEDULER", "KWOK")


def pick_ports() -> dict[str, int]:
    """Free ports for a second cluster, drawn below the kernel's ephemeral range (32768+ here): a
    fixed port up there can be held at any moment by some client connection's local end, which is
    how a CI run once found 33800 taken."""
    low, _ = localcluster.ephemeral_range()
    candidates = [p for p in random.sample(range(21000, min(low, 32768)), 200) if localcluster.port_free(p)]
    return dict(zip(PORT_NAMES, candidates, strict=False))


def cluster(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLUSTER), *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300, check=False)


def procs_under(state: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(state) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.fixture
def alt_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {"OCULIS_E2E_STATE": str(tmp_path / "state")}
    env.update({f"OCULIS_E2E_{k}_PORT": str(v) for k, v in pick_ports().items()})
    yield env
    cluster("down", env=env)


def test_up_is_idempotent(kubeconfig: Path) -> None:
    again = cluster("up")
    assert again.returncode == 0
    assert again.stdout.strip() == str(kubeconfig)
    assert "already running" in again.stderr


def test_port_taken_gives_one_line_cause_and_no_strays(alt_env: dict[str, str]) -> None:
    apiserver = alt_env["OCULIS_E2E_APISERVER_PORT"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", int(apiserver)))
        s.listen()
        proc = cluster("up", env=alt_env)
    assert proc.returncode == 1
    errors = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1, proc.stderr
    assert f"127.0.0.1:{apiserver} (apiserver) is already in use" in errors[0]
    assert "OCULIS_E2E_APISERVER_PORT" in errors[0]
    assert "Traceback" not in proc.stderr
    assert procs_under(Path(alt_env["OCULIS_E2E_STATE"])) == []


def test_missing_go_toolchain_is_named(tmp_path: Path) -> None:
    # A PATH holding every program of /usr/bin and /bin but Go's, so the check runs wherever Go is installed.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in (Path("/usr/bin"), Path("/bin")):
        for program in folder.iterdir():
            if program.name not in {"go", "gofmt"} and not os.path.lexists(bin_dir / program.name):
                (bin_dir / program.name).symlink_to(program)
    env = {"OCULIS_E2E_CACHE": str(tmp_path / "cache"), "OCULIS_E2E_STATE": str(tmp_path / "state"),
           "PATH": str(bin_dir)}
    proc = cluster("up", env=env)
    assert proc.returncode == 1
    assert "Go toolchain not found; install Go >= 1.26" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_down_after_a_crash_leaves_nothing(alt_env: dict[str, str], kubeconfig: Path) -> None:
    state = Path(alt_env["OCULIS_E2E_STATE"])
    up = cluster("up", env=alt_env)
    assert up.returncode == 0, up.stderr
    assert cluster("status", env=alt_env).returncode == 0
    # Crash: the API server dies hard; the others keep running and must still be cleaned up.
    apiserver = int((state / "pids" / "kube-apiserver.pid").read_text())
    os.kill(apiserver, signal.SIGKILL)
    eventually(lambda: cluster("status", env=alt_env).returncode == 1, timeout=20, what="status to notice")
    assert len(procs_under(state)) >= 3
    down = cluster("down", env=alt_env)
    assert down.returncode == 0, down.stderr
    deadline = Deadline(10)
    while procs_under(state) and not deadline.expired():
        time.sleep(0.1)
    assert procs_under(state) == []
    assert not state.exists()
    # `down` on an already-stopped cluster is still fine.
    assert cluster("down", env=alt_env).returncode == 0
