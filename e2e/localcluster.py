"""A real local Kubernetes control plane on 127.0.0.1 for Oculis' e2e tests and demo.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as plain processes
built from Go modules by `e2e/build.sh`; kwok turns Node objects into fake GPU nodes and walks pods
through Stages, so the real scheduler and Deployment controller do real scheduling and rollouts.
State (certs, etcd data, logs, pids, kubeconfig) lives in `e2e/.cluster/`, which git ignores.

Used through the `e2e/cluster` shim: `up`, `down`, `status`, `bin-dir`, `serve-pods` (engine pods
become simulator processes, scraped by a local Prometheus).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "crds"))
from oculis import gpus  # noqa: E402  (source root added just above)

STATE = Path(os.environ.get("OCULIS_E2E_STATE", HERE / ".cluster"))
KUBECONFIG = STATE / "kubeconfig"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
# Started on demand by `serve-pods` (pods that serve: e2e/podstandin.py), stopped by `down` too.
EXTRAS = ("podstandin", "prometheus")
SIM = STATE / "sim"  # the stand-in's targets.json, endpoints.json and per-pod simulator logs


class ClusterError(Exception):
    """A failure with a one-line cause and fix, printed without a traceback."""


@dataclass(frozen=True)
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    @classmethod
    def from_env(cls) -> Ports:
        def port(name: str, default: int) -> int:
            raw = os.environ.get(f"OCULIS_E2E_{name}_PORT", str(default))
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise ClusterError(f"OCULIS_E2E_{name}_PORT={raw!r} is not a port; set it to 1-65535")
            return int(raw)

        return cls(
            etcd=port("ETCD", 23790),
            etcd_peer=port("ETCD_PEER", 23800),
            apiserver=port("APISERVER", 26443),
            controller_manager=port("CONTROLLER_MANAGER", 20257),
            scheduler=port("SCHEDULER", 20259),
            kwok=port("KWOK", 20247),
        )

    def items(self) -> list[tuple[str, int]]:
        return list(self.__dict__.items())


def log(msg: str) -> None:
    print(f"e2e/cluster: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- binaries and pools


def build_binaries() -> Path:
    """Run e2e/build.sh (a no-op when the versioned cache is complete) and return the bin dir."""
    try:
        proc = subprocess.run(
            [str(HERE / "build.sh")], stdout=subprocess.PIPE, stderr=None, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise ClusterError(f"cannot run e2e/build.sh: {exc}") from None
    if proc.returncode != 0:
        raise ClusterError("building the control plane failed (see e2e/build output above); fix it and rerun")
    return Path(proc.stdout.strip().splitlines()[-1]) / "bin"


def load_pools(path: Path) -> list[dict[str, Any]]:
    """Read the node-pool file; every error names the field and the fix."""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterError(f"cannot read pools file {path}: {exc}") from None
    pools = (doc or {}).get("pools")
    if not isinstance(pools, list) or not pools:
        raise ClusterError(f"{path}: `pools` must be a non-empty list of {{name, product, nodes, gpusPerNode}}")
    out = []
    for i, pool in enumerate(pools):
        where = f"{path}: pools[{i}]"
        if not isinstance(pool, dict):
            raise ClusterError(f"{where} must be a mapping")
        name = str(pool.get("name", ""))
        if not name.replace("-", "").isalnum() or name.lower() != name:
            raise ClusterError(f"{where}.name={name!r} must be a lowercase DNS label, e.g. h100")
        try:
            product = gpus.lookup(str(pool.get("product", "")))
        except KeyError as exc:
            raise ClusterError(f"{where}.product: {exc.args[0]}") from None
        for field, default in (("nodes", 2), ("gpusPerNode", 8)):
            value = pool.get(field, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ClusterError(f"{where}.{field}={value!r} must be a positive integer")
        out.append({"name": name, "product": product, "nodes": pool.get("nodes", 2),
                    "gpus": pool.get("gpusPerNode", 8)})
    return out


def node_manifests(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    nodes = []
    for pool in pools:
        p: gpus.GPUProduct = pool["product"]
        for i in range(pool["nodes"]):
            resources = {"cpu": "96", "memory": "1Ti", "pods": "110", gpus.GPU_RESOURCE: str(pool["gpus"])}
            nodes.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"{pool['name']}-pool-{i}",
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "kubernetes.io/hostname": f"{pool['name']}-pool-{i}",
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "type": "kwok",
                        "oculis.dev/pool": pool["name"],
                        gpus.GPU_PRODUCT_LABEL: p.gfd_product,
                        "nvidia.com/gpu.memory": str(p.memory_mib),
                        "nvidia.com/gpu.count": str(pool["gpus"]),
                        "nvidia.com/gpu.family": p.family,
                        "nvidia.com/gpu.compute.major": str(p.compute_major),
                        "nvidia.com/gpu.compute.minor": str(p.compute_minor),
                        "nvidia.com/gpu.present": "true",
                    },
                },
                "spec": {"taints": [{"key": gpus.GPU_TAINT_KEY, "value": gpus.GPU_TAINT_VALUE,
                                     "effect": gpus.GPU_TAINT_EFFECT}]},
                "status": {"capacity": resources, "allocatable": resources},
            })
    return nodes


# ---------------------------------------------------------------- processes


def pid_file(name: str) -> Path:
    return STATE / "pids" / f"{name}.pid"


def running_pid(name: str) -> int | None:
    """The pid of our component if it is alive and really ours (its cmdline mentions our state dir)."""
    try:
        pid = int(pid_file(name).read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (OSError, ValueError):
        return None
    return pid if str(STATE) in cmdline else None


def stray_pids() -> list[int]:
    """Every process whose command line points into our state dir (survivors of a crash)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmd = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            ours = Path(cmd[0]).name in (*COMPONENTS, "prometheus") or any(
                part.endswith("podstandin.py") for part in cmd[1:2])
            if cmd and ours and any(str(STATE) in part for part in cmd):
                found.append(int(proc.name))
    return found


STARTED: dict[str, subprocess.Popen[bytes]] = {}  # this invocation's children, for exit checks


def start(name: str, argv: list[str]) -> None:
    (STATE / "logs").mkdir(parents=True, exist_ok=True)
    (STATE / "pids").mkdir(parents=True, exist_ok=True)
    with open(STATE / "logs" / f"{name}.log", "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=STATE)
    STARTED[name] = proc
    pid_file(name).write_text(str(proc.pid))


def stop_all() -> int:
    # The pod stand-in first in the list: it stops its simulators on SIGTERM (they also die with it).
    pids = {p for p in (running_pid(n) for n in (*EXTRAS, *COMPONENTS)) if p} | set(stray_pids())
    pids |= {proc.pid for proc in STARTED.values() if proc.poll() is None}
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def restart_component(name: str, timeout: float = 90) -> float:
    """Stop one running component (SIGTERM) and start it again with the same command line, as a node
    reboot or an upgrade of the control plane does; returns the seconds until it answered again. For
    the chaos tests (kube-apiserver); the cluster is left up."""
    pid = running_pid(name)
    if pid is None:
        raise ClusterError(f"{name} is not running; start the cluster with `e2e/cluster up`")
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while Path(f"/proc/{pid}").exists() and not _zombie(pid) and time.monotonic() - t0 < 30:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    start(name, argv)
    ports = Ports.from_env()
    probes = {"kube-apiserver": lambda: api_get(ports, "/readyz") == "ok",
              "etcd": lambda: b"true" in urllib.request.urlopen(f"http://127.0.0.1:{ports.etcd}/health",
                                                                timeout=2).read()}
    wait_for(name, probes.get(name, lambda: True), timeout, name)
    return time.monotonic() - t0


@contextlib.contextmanager
def paused(name: str) -> Any:
    """SIGSTOP a component for the body of the `with` (an etcd that stalls on a slow disk), SIGCONT after."""
    pid = running_pid(name)
    if pid is None:
        raise ClusterError(f"{name} is not running; start the cluster with `e2e/cluster up`")
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the Go servers do: a port whose old connections sit in TIME_WAIT is free to listen on.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def check_ports_free(ports: Ports) -> None:
    for name, port in ports.items():
        if not port_free(port):
            env = f"OCULIS_E2E_{name.upper()}_PORT"
            low, high = ephemeral_range()
            hint = (f" below {low} (ports {low}-{high} are the kernel's ephemeral range, which client "
                    "connections take at random)" if low <= port <= high else "")
            raise ClusterError(
                f"port 127.0.0.1:{port} ({name}) is already in use; stop whatever holds it "
                f"(`ss -ltnp 'sport = :{port}'`) or set {env} to a free port{hint}"
            )


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def wait_for(what: str, probe: Any, timeout: float, log_name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc = STARTED.get(log_name)
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"{what} exited during start-up; see {STATE}/logs/{log_name}.log")
        with contextlib.suppress(Exception):
            if probe():
                return
        time.sleep(0.2)
    raise ClusterError(f"{what} not ready after {timeout:.0f}s; see {STATE}/logs/{log_name}.log")


# ---------------------------------------------------------------- PKI and kubeconfig


def openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=STATE / "pki", capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def make_pki() -> str:
    pki = STATE / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "3650", "-subj", "/CN=oculis-e2e-ca")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
            "-subj", "/CN=kube-apiserver")
    (pki / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "apiserver.crt", "-days", "3650", "-extfile", "san.ext")
    openssl("genrsa", "-out", "sa.key", "2048")
    openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
    token = secrets.token_hex(24)
    # Test-only static token for a system:masters admin; never used outside this sandbox.
    (pki / "tokens.csv").write_text(f'{token},oculis-admin,oculis-admin,"system:masters"\n')
    return token


def write_kubeconfig(ports: Ports, token: str) -> None:
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "oculis-e2e",
        "clusters": [{"name": "oculis-e2e", "cluster": {
            "server": f"https://127.0.0.1:{ports.apiserver}",
            "certificate-authority": str(STATE / "pki" / "ca.crt")}}],
        "users": [{"name": "oculis-admin", "user": {"token": token}}],
        "contexts": [{"name": "oculis-e2e", "context": {"cluster": "oculis-e2e", "user": "oculis-admin"}}],
    }
    KUBECONFIG.write_text(yaml.safe_dump(cfg))
    KUBECONFIG.chmod(0o600)


def api_get(ports: Ports, path: str) -> Any:
    token = (STATE / "pki" / "tokens.csv").read_text().split(",")[0]
    ctx = ssl.create_default_context(cafile=str(STATE / "pki" / "ca.crt"))
    req = urllib.request.Request(f"https://127.0.0.1:{ports.apiserver}{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, context=ctx, timeout=5) as resp:
        body = resp.read()
    return json.loads(body) if body.startswith(b"{") else body.decode()


def kubectl(bin_dir: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run([str(bin_dir / "kubectl"), "--kubeconfig", str(KUBECONFIG), *args],
                          input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ClusterError(f"kubectl {' '.join(args[:2])} failed: {proc.stderr.strip()}")
    return proc.stdout


# ---------------------------------------------------------------- commands


def is_up(ports: Ports) -> bool:
    if any(running_pid(n) is None for n in COMPONENTS) or not KUBECONFIG.exists():
        return False
    try:
        return bool(api_get(ports, "/readyz") == "ok")
    except Exception:
        return False


def up(pools_path: Path) -> Path:
    ports = Ports.from_env()
    pools = load_pools(pools_path)  # parse before starting anything
    t0 = time.monotonic()
    bin_dir = build_binaries()
    t_build = time.monotonic() - t0
    if is_up(ports):
        log("already running")
        return KUBECONFIG
    if stop_all():
        log("cleaned up processes left over from an earlier run")
    check_ports_free(ports)
    for tool in ("openssl",):
        if subprocess.run(["which", tool], capture_output=True, check=False).returncode != 0:
            raise ClusterError(f"{tool} not found; install it (apt-get install -y {tool})")
    t1 = time.monotonic()
    STATE.mkdir(parents=True, exist_ok=True)
    for sub in ("etcd", "pki", "logs", "pids"):
        subprocess.run(["rm", "-rf", str(STATE / sub)], check=True)
    try:
        _start_components(bin_dir, ports, pools)
    except BaseException:
        stop_all()
        raise
    log(f"up in {time.monotonic() - t1:.1f}s (binaries ready in {t_build:.1f}s); "
        f"control plane RSS {rss_mib():.0f} MiB")
    return KUBECONFIG


def _start_components(bin_dir: Path, ports: Ports, pools: list[dict[str, Any]]) -> None:
    token = make_pki()
    pki = STATE / "pki"
    start("etcd", [
        str(bin_dir / "etcd"), "--name=oculis-e2e", f"--data-dir={STATE / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{ports.etcd}",
        f"--advertise-client-urls=http://127.0.0.1:{ports.etcd}",
        f"--listen-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{ports.etcd_peer}",
        f"--initial-cluster=oculis-e2e=http://127.0.0.1:{ports.etcd_peer}",
        "--unsafe-no-fsync", "--quota-backend-bytes=4294967296", "--log-level=warn",
    ])
    wait_for("etcd", lambda: b"true" in urllib.request.urlopen(
        f"http://127.0.0.1:{ports.etcd}/health", timeout=2).read(), 30, "etcd")
    start("kube-apiserver", [
        str(bin_dir / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ports.etcd}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={ports.apiserver}",
        f"--cert-dir={pki}", f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}", f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}", "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
        "--allow-privileged=true", "--enable-priority-and-fairness=false", "--profiling=false",
    ])
    wait_for("kube-apiserver", lambda: api_get(ports, "/readyz") == "ok", 90, "kube-apiserver")
    write_kubeconfig(ports, token)
    kc = str(KUBECONFIG)
    start("kube-controller-manager", [
        str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports.controller_manager}", "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
        "--use-service-account-credentials=false",
        "--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle",
        "--node-monitor-grace-period=60s", "--profiling=false",
    ])
    start("kube-scheduler", [
        str(bin_dir / "kube-scheduler"), f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
        "--bind-address=127.0.0.1", f"--secure-port={ports.scheduler}", "--leader-elect=false",
        "--profiling=false",
    ])
    start("kwok", [
        str(bin_dir / "kwok"), f"--kubeconfig={kc}", f"--config={HERE / 'kwok-stages.yaml'}",
        "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--node-lease-duration-seconds=40", "--cidr=10.0.0.1/16", "--node-ip=10.0.0.1",
        f"--server-address=127.0.0.1:{ports.kwok}",
    ])
    kubectl(bin_dir, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List",
                                                          "items": node_manifests(pools)}))
    want = sum(p["nodes"] for p in pools)

    def nodes_ready() -> bool:
        items = api_get(ports, "/api/v1/nodes")["items"]
        ready = [n for n in items if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in n.get("status", {}).get("conditions", []))]
        return bool(len(ready) >= want)

    wait_for("GPU nodes", nodes_ready, 60, "kwok")

    def default_sa() -> bool:
        return bool(api_get(ports, "/api/v1/namespaces/default/serviceaccounts/default"))

    wait_for("kube-controller-manager (default ServiceAccount)", default_sa, 60, "kube-controller-manager")


def rss_mib() -> float:
    total = 0
    for name in COMPONENTS:
        pid = running_pid(name)
        if pid:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
    return total / 1024


def status() -> int:
    ports = Ports.from_env()
    for name in COMPONENTS:
        pid = running_pid(name)
        rss = ""
        if pid:
            with contextlib.suppress(OSError):
                rss = next(ln.split()[1] for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                           if ln.startswith("VmRSS:"))
                rss = f"{int(rss) / 1024:.0f} MiB"
        print(f"{name:24} {'running pid ' + str(pid) if pid else 'stopped':20} {rss}")
    for name in EXTRAS:
        if pid := running_pid(name):
            print(f"{name:24} {'running pid ' + str(pid):20}")
    healthy = is_up(ports)
    print(f"{'api':24} {'ready' if healthy else 'not ready':20} total RSS {rss_mib():.0f} MiB")
    print(f"kubeconfig: {KUBECONFIG}")
    return 0 if healthy else 1


def prometheus_port() -> int:
    raw = os.environ.get("OCULIS_E2E_PROMETHEUS_PORT", "29090")
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ClusterError(f"OCULIS_E2E_PROMETHEUS_PORT={raw!r} is not a port; set it to 1-65535")
    return int(raw)


def start_prometheus() -> str | None:
    """A real Prometheus on 127.0.0.1 scraping the stand-in's file_sd targets every second; its URL,
    or None (said once) where the `prometheus` binary is not installed."""
    port = prometheus_port()
    url = f"http://127.0.0.1:{port}"
    if running_pid("prometheus"):
        return url
    binary = shutil.which("prometheus")
    if binary is None:
        log("prometheus not found: pods serve, but nothing scrapes them (apt-get install -y prometheus)")
        return None
    if not port_free(port):
        raise ClusterError(f"port 127.0.0.1:{port} (prometheus) is already in use; stop whatever holds it "
                           f"(`ss -ltnp 'sport = :{port}'`) or set OCULIS_E2E_PROMETHEUS_PORT to a free port")
    prom = STATE / "prometheus"
    prom.mkdir(parents=True, exist_ok=True)
    (prom / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "vllm", "file_sd_configs": [
            {"files": [str(SIM / "targets.json")], "refresh_interval": "1s"}]},
            # Tests add targets of their own (a local `oculis serve`'s metrics) as extra-*.json files.
            {"job_name": "extra", "file_sd_configs": [
                {"files": [str(SIM / "extra-*.json")], "refresh_interval": "1s"}]}],
    }))
    start("prometheus", [binary, f"--config.file={prom / 'prometheus.yml'}", f"--storage.tsdb.path={prom / 'tsdb'}",
                         f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1d",
                         "--log.level=warn"])
    wait_for("prometheus", lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2).status == 200, 30,
             "prometheus")
    return url


def stop_extras() -> int:
    pids = [p for p in (running_pid(n) for n in EXTRAS) if p]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20  # the stand-in gives its simulators 10 s to finish streams
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() and not _zombie(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def serve_pods(namespaces: list[str], stop: bool) -> dict[str, Any]:
    """(Re)start the pod stand-in over `namespaces` (all when empty) and Prometheus; or stop both."""
    if stop:
        n = stop_extras()
        log(f"serve-pods stopped ({n} processes)")
        return {}
    ports = Ports.from_env()
    if not is_up(ports):
        raise ClusterError("the control plane is not running; start it with `e2e/cluster up`")
    if pid := running_pid("podstandin"):  # one stand-in at a time: it owns targets.json and endpoints.json
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and not _zombie(pid):
            time.sleep(0.1)
    SIM.mkdir(parents=True, exist_ok=True)
    start("podstandin", [sys.executable, str(HERE / "podstandin.py"), f"--kubeconfig={KUBECONFIG}",
                         f"--state={SIM}", *(f"--namespace={ns}" for ns in namespaces)])
    wait_for("pod stand-in", lambda: (SIM / "endpoints.json").exists(), 30, "podstandin")
    url = start_prometheus()
    out = {"targets": str(SIM / "targets.json"), "endpoints": str(SIM / "endpoints.json"), "prometheus": url,
           "logs": str(SIM / "logs")}
    log(f"engine pods in {', '.join(namespaces) or 'all namespaces'} serve as simulators; endpoint map "
        f"{out['endpoints']}; Prometheus {url or '(not installed)'}")
    return out


def down() -> None:
    n = stop_all()
    subprocess.run(["rm", "-rf", str(STATE)], check=True)
    log(f"down (stopped {n} processes, removed {STATE})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e/cluster", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="build if needed, start, print the kubeconfig path (idempotent)")
    p_up.add_argument("--pools", type=Path, default=Path(os.environ.get("OCULIS_E2E_POOLS", HERE / "pools.yaml")))
    sub.add_parser("down", help="stop every process and remove the state (safe after a crash)")
    sub.add_parser("status", help="show processes, memory and API health")
    sub.add_parser("bin-dir", help="print the directory holding kubectl, helm and the rest")
    p_sp = sub.add_parser("serve-pods", help="engine pods become `oculis sim serve` processes on 127.0.0.1 "
                          "(e2e/podstandin.py), scraped by a local Prometheus; prints their files as JSON")
    p_sp.add_argument("--namespace", action="append", default=[], help="only pods of these namespaces (repeatable)")
    p_sp.add_argument("--stop", action="store_true", help="stop the stand-in (and its simulators) and Prometheus")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "up":
            print(up(args.pools))
        elif args.cmd == "down":
            down()
        elif args.cmd == "status":
            return status()
        elif args.cmd == "bin-dir":
            print(build_binaries())
        elif args.cmd == "serve-pods":
            out = serve_pods(args.namespace, args.stop)
            if out:
                print(json.dumps(out))
    except ClusterError as exc:
        print(f"e2e/cluster: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        stop_all()
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
