"""Runs the real operator (`kopf run -m oculis_operator.handlers`) against the sandbox cluster, with
its validating webhook served on 127.0.0.1 under a throwaway self-signed certificate."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from e2e_support import localcluster
from time_scale import Deadline

ROOT = Path(__file__).resolve().parents[2]
# Who may reach the engines, as the chart renders it for a release `oculis` in oculis-system (engine_access.Peers).
SANDBOX_PEERS = {
    "router": {"namespace": "oculis-system", "labels": {"app.kubernetes.io/name": "oculis",
                                                        "app.kubernetes.io/component": "router"}},
    "operator": {"namespace": "oculis-system", "labels": {"app.kubernetes.io/name": "oculis",
                                                          "app.kubernetes.io/component": "operator"}},
    "monitoringNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"},
    "extraFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}}}],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def self_signed(dir_: Path) -> tuple[Path, Path]:
    cert, key = dir_ / "webhook.crt", dir_ / "webhook.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


class OperatorProcess:
    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        cert, key = self_signed(workdir)
        self.log_path = workdir / "operator.log"
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "OCULIS_WEBHOOK_PORT": str(free_port()),
                    "OCULIS_RECHECK_SECONDS": "1",
                    # the speculative-decoding guard judges acceptance over this window (seconds, not minutes)
                    "OCULIS_SPECULATIVE_WINDOW_SECONDS": "15",
                    "OCULIS_METRICS_PORT": str(free_port()), "OCULIS_METRICS_ADDR": "127.0.0.1",
                    "OCULIS_WEBHOOK_ADDR": "127.0.0.1", "OCULIS_WEBHOOK_HOST": "127.0.0.1",
                    "OCULIS_WEBHOOK_CERT": str(cert), "OCULIS_WEBHOOK_KEY": str(key), "OCULIS_WEBHOOK_CA": str(cert),
                    # the sandbox's Prometheus (e2e/cluster serve-pods), for the plan-vs-engine KV check
                    "OCULIS_PROMETHEUS_URL":
                        f"http://127.0.0.1:{os.environ.get('OCULIS_E2E_PROMETHEUS_PORT', '29090')}",
                    # engine pods (LoRA adapter loading) reached at the pod stand-in's loopback ports, never
                    # at their fake pod IPs
                    "OCULIS_ENGINE_ENDPOINTS": str(localcluster.SIM / "endpoints.json"),
                    "OCULIS_ADAPTER_SECONDS": "1",
                    # a NetworkPolicy per GPUUpstream as the chart configures it (the sandbox enforces none)
                    "OCULIS_NETWORK_POLICY": json.dumps(SANDBOX_PEERS)}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        kopf = Path(sys.executable).with_name("kopf")
        self.proc = subprocess.Popen([str(kopf), "run", "--standalone", "--all-namespaces", "-m",
                                      "oculis_operator.handlers"], env=self.env, stdout=log, stderr=log,
                                     start_new_session=True)

    def stop(self, hard: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, probe: object, timeout: float = 60) -> None:
        deadline = Deadline(timeout)
        while not deadline.expired():
            assert self.proc and self.proc.poll() is None, f"operator exited:\n{self.log()[-3000:]}"
            if callable(probe) and probe():
                return
            time.sleep(0.3)
        raise TimeoutError(f"operator not ready:\n{self.log()[-3000:]}")
