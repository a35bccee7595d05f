"""Pod stand-in for the sandbox cluster: engine pods become real `oculis sim serve` processes.

kwok walks pods to Running but runs nothing. This watches the Running pods of GPUUpstreams'
Deployments (labels app.kubernetes.io/managed-by=oculis, app.kubernetes.io/name=vllm, or vllm-canary for
a canary's pods) and, for each,
starts `oculis sim serve` with the pod's own container arguments (its rendered `vllm serve` argv) and
environment (its literal `env` values, e.g. VLLM_ALLOW_RUNTIME_LORA_UPDATING) on a free 127.0.0.1
port (a later --host/--port overrides the pod's 0.0.0.0:8000) and the node's GFD product label as
--gpu. A pod that is deleted, terminating or no longer Running has its process stopped (SIGTERM, as
the kubelet does). Once a simulator answers /health it is listed in:
  - targets.json: Prometheus file-based discovery targets labelled namespace, pod, upstream;
  - endpoints.json: {SERVICE_HOST: {namespace, upstream, ports, pods}} for `oculis serve --endpoints`,
    keyed by the host of the base_url the operator writes into the router config: the stable Service
    `<upstream>-vllm` maps to the stable pods only, the canary Service `<upstream>-vllm-canary` to the
    canary's, as their Services select them.
Both are rewritten atomically (rename), so readers never see half a file. Only 127.0.0.1 is ever
dialled or listened on; pod and Service IPs are not.

A pod annotated `oculis.dev/e2e-real-vllm: "true"` (spec.podAnnotations) runs real vLLM on CPU instead
(tests/realengine: the engine virtualenv from OCULIS_VLLM_VENV, the tiny model from OCULIS_TINY_MODEL or
built once), with the pod's own flags fitted to the tiny model (real_vllm_argv), so a rollout of engine
settings changes what the real engine reports. Whoever annotates a pod holds the machine's engine lock.

Usually started by `e2e/cluster serve-pods [--namespace NS]`; runnable alone:
  python e2e/podstandin.py --kubeconfig K --state DIR [--namespace NS ...]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
SELECTOR = "app.kubernetes.io/managed-by=oculis,app.kubernetes.io/name in (vllm,vllm-canary)"
UPSTREAM_LABEL = "oculis.dev/upstream"
TRACK_LABEL = "oculis.dev/track"  # "canary" on a canary Deployment's pods (render.TRACK_LABEL)
PRODUCT_LABEL = "nvidia.com/gpu.product"
REAL_ANNOTATION = "oculis.dev/e2e-real-vllm"  # "true": this pod runs real vLLM on CPU, not the simulator
SERVICE_PORT = 8000  # the operator's Service port (engine_args.PORT); the map replaces host and port
RESTART_BACKOFF_S = 5.0  # a simulator that exits is restarted after this, as a kubelet's CrashLoopBackOff
STOP_GRACE_S = 10.0
ENGINE_KEY_ENV = "VLLM_API_KEY"  # the engine's API key (oculis.engine_access.ENGINE_KEY_ENV)


def log(msg: str) -> None:
    print(f"podstandin: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- functional core


@dataclass(frozen=True)
class PodView:
    """What the stand-in needs of one engine pod."""

    namespace: str
    name: str
    uid: str
    upstream: str
    args: tuple[str, ...]
    node: str | None
    serving: bool  # Running and not being deleted: a process should run for it
    track: str = "stable"  # or "canary": which Service selects it
    real: bool = False  # annotated REAL_ANNOTATION: real vLLM on CPU
    env: tuple[tuple[str, str], ...] = ()  # the engine container's env with literal values, as the kubelet sets it
    # its env from Secret keys (name, secret, key), resolved as the kubelet does when the process starts
    secret_env: tuple[tuple[str, str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}/{self.uid}"

    @property
    def service_host(self) -> str:
        # render.endpoint(): http://{upstream}-vllm.{namespace}.svc:8000/v1; render.canary_endpoint():
        # http://{upstream}-vllm-canary.{namespace}.svc:8000/v1
        suffix = "-canary" if self.track == "canary" else ""
        return f"{self.upstream}-vllm{suffix}.{self.namespace}.svc"


def pod_view(pod: Mapping[str, Any]) -> PodView | None:
    """A pod object (as the API returns it, camelCase) -> PodView; None for a pod without an upstream."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    upstream = labels.get(UPSTREAM_LABEL)
    containers = spec.get("containers") or []
    if not upstream or not containers:
        return None
    return PodView(namespace=meta.get("namespace", ""), name=meta.get("name", ""), uid=meta.get("uid", ""),
                   upstream=upstream, args=tuple(containers[0].get("args") or ()), node=spec.get("nodeName"),
                   serving=status.get("phase") == "Running" and not meta.get("deletionTimestamp"),
                   track="canary" if labels.get(TRACK_LABEL) == "canary" else "stable",
                   real=(meta.get("annotations") or {}).get(REAL_ANNOTATION) == "true",
                   env=tuple((str(e["name"]), str(e["value"])) for e in containers[0].get("env") or []
                             if isinstance(e, dict) and e.get("name") and isinstance(e.get("value"), str)),
                   secret_env=tuple(secret_refs(containers[0].get("env") or [])))


def secret_refs(env: list[Any]) -> list[tuple[str, str, str]]:
    """(variable, Secret, key) of each env entry taken from a Secret key (valueFrom.secretKeyRef)."""
    out = []
    for e in env:
        ref = ((e.get("valueFrom") or {}).get("secretKeyRef") or {}) if isinstance(e, dict) else {}
        if e.get("name") and ref.get("name") and ref.get("key"):
            out.append((str(e["name"]), str(ref["name"]), str(ref["key"])))
    return out


def kv_events_override(pod: PodView, port: int) -> str | None:
    """A pod that publishes KV events (--kv-events-config, the kv-events picker) publishes them here on
    127.0.0.1:`port` instead of its pod port (every pod has the same one); None when it does not."""
    rendered = next((a.split("=", 1)[1] for a in pod.args if a.startswith("--kv-events-config=")), None)
    if rendered is None:
        return None
    try:
        cfg = json.loads(rendered)
    except ValueError:
        return None
    # a wildcard is bound (vLLM connects to an explicit address instead); the router dials 127.0.0.1:port
    return json.dumps({**cfg, "endpoint": f"tcp://*:{port}"}, sort_keys=True, separators=(",", ":"))


def sim_argv(oculis: str, pod: PodView, port: int, gpu: str | None, kv_port: int | None = None) -> list[str]:
    """The pod's own argv, then the overrides: argparse keeps the last --host/--port (and
    --kv-events-config, moved to `kv_port`)."""
    argv = [oculis, "sim", "serve", *pod.args, "--host", LOOPBACK, "--port", str(port)]
    kv = kv_events_override(pod, kv_port) if kv_port is not None else None
    return argv + (["--gpu", gpu] if gpu else []) + ([f"--kv-events-config={kv}"] if kv else [])


# Flags the tiny model on one CPU cannot take as a GPU pod renders them: replaced or dropped.
_CPU_DROPS = ("--tensor-parallel-size", "--quantization", "--max-model-len", "--max-num-batched-tokens",
              "--host", "--port", "--kv-events-config")


def real_vllm_argv(vllm: str, model: str, pod: PodView, port: int) -> list[str]:
    """`vllm serve` on the tiny model with the pod's own engine flags, fitted to a CPU: TP 1, no weight
    quantization, the tiny model's context, no draft weights (ngram speculation stays), eager."""
    out = [vllm, "serve", model]
    for arg in pod.args[1:]:
        flag = arg.split("=", 1)[0]
        if flag in _CPU_DROPS or (flag == "--speculative-config" and '"ngram"' not in arg):
            continue
        out.append(arg)
    return [*out, "--max-model-len=512", "--dtype=bfloat16", "--enforce-eager", "--host", LOOPBACK,
            "--port", str(port)]


def plan(pods: Iterable[PodView], running: Iterable[str]) -> tuple[list[PodView], list[str]]:
    """(pods to start a process for, process keys to stop)."""
    want = {p.key: p for p in pods if p.serving}
    have = set(running)
    return [p for k, p in sorted(want.items()) if k not in have], sorted(have - want.keys())


@dataclass(frozen=True)
class Serving:
    pod: PodView
    port: int
    pid: int
    kv_events: str | None = None  # its KV-event publisher (tcp://127.0.0.1:PORT), for the router's kv-events picker


def file_sd(serving: Iterable[Serving]) -> list[dict[str, Any]]:
    """Prometheus file_sd_configs targets, one group per pod (labels become series labels)."""
    return [{"targets": [f"{LOOPBACK}:{s.port}"],
             "labels": {"namespace": s.pod.namespace, "pod": s.pod.name, "upstream": s.pod.upstream}}
            for s in sorted(serving, key=lambda s: (s.pod.namespace, s.pod.name))]


def endpoint_map(serving: Iterable[Serving], known: Iterable[PodView] = ()) -> dict[str, Any]:
    """Service host -> loopback ports. A host of a pod seen before but not serving now maps to no
    ports, so the router says "no pod serves it" instead of asking DNS for a name that cannot resolve."""
    out: dict[str, Any] = {}
    for p in sorted(known, key=lambda p: p.service_host):
        out.setdefault(p.service_host, {"namespace": p.namespace, "upstream": p.upstream, "ports": [], "pods": []})
    for s in sorted(serving, key=lambda s: (s.pod.namespace, s.pod.name)):
        entry = out.setdefault(s.pod.service_host, {"namespace": s.pod.namespace, "upstream": s.pod.upstream,
                                                    "ports": [], "pods": []})
        entry["ports"].append(s.port)
        entry["pods"].append({"pod": s.pod.name, "port": s.port, "pid": s.pid,
                              **({"kv_events": s.kv_events} if s.kv_events else {})})
    return out


# ---------------------------------------------------------------- processes and files


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """Child setup: SIGTERM when the stand-in dies, even by SIGKILL (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def write_atomic(path: Path, doc: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/health", timeout=1) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@dataclass
class Proc:
    pod: PodView
    port: int
    popen: subprocess.Popen[bytes]
    ready: bool = False
    kv_events: str | None = None


@dataclass
class StandIn:
    state: Path  # targets.json, endpoints.json and logs/ go here
    oculis: str
    gpu_of: Callable[[str], str | None] = lambda node: None  # node name -> its GFD product label
    # (namespace, Secret, key) -> the value, None when missing (the kubelet then does not start the container)
    secret_of: Callable[[str, str, str], str | None] = lambda ns, secret, key: None
    pods: dict[str, PodView] = field(default_factory=dict)
    seen: dict[str, PodView] = field(default_factory=dict)  # service host -> a pod of it, ever seen
    procs: dict[str, Proc] = field(default_factory=dict)
    stopping: list[tuple[float, subprocess.Popen[bytes]]] = field(default_factory=list)
    crashed: dict[str, float] = field(default_factory=dict)  # pod key -> when it may be restarted
    lock: threading.Lock = field(default_factory=threading.Lock)
    _written: Any = None

    def __post_init__(self) -> None:
        (self.state / "logs").mkdir(parents=True, exist_ok=True)
        self.write()

    def update(self, kind: str, pod: PodView) -> None:
        with self.lock:
            self.seen[pod.service_host] = pod
            if kind == "DELETED":
                self.pods.pop(pod.key, None)
            else:
                self.pods[pod.key] = pod
        self.reconcile()

    def reconcile(self) -> None:
        with self.lock:
            now = time.monotonic()
            for key, proc in list(self.procs.items()):  # a simulator that exited: like a crashed container
                if proc.popen.poll() is not None:
                    log(f"{key}: simulator exited with {proc.popen.returncode}; see {self._log(proc.pod)}; "
                        f"restart in {RESTART_BACKOFF_S:g}s")
                    del self.procs[key]
                    self.crashed[key] = now + RESTART_BACKOFF_S
            start, stop = plan(self.pods.values(), self.procs)
            for key in stop:
                self._stop(key)
            self.write()  # stopped ones leave the files before their process goes
            for pod in start:
                if self.crashed.get(pod.key, 0) <= now:
                    self._start(pod)
            for proc in self.procs.values():
                if not proc.ready:
                    proc.ready = healthy(proc.port)
            self.write()
            for t, p in list(self.stopping):
                if p.poll() is not None:
                    self.stopping.remove((t, p))
                elif now - t > STOP_GRACE_S:
                    _signal(p, signal.SIGKILL)

    def _log(self, pod: PodView) -> Path:
        return self.state / "logs" / f"{pod.namespace}_{pod.name}.log"

    def _secret_env(self, pod: PodView) -> dict[str, str] | None:
        """The pod's env from Secrets, or None when one is missing (CreateContainerConfigError: retried).
        The engine's API key is also written where the sandbox's router reads it (state/engine-keys/<upstream>,
        as the chart mounts the Secret in the router pod): `oculis serve` with OCULIS_ENGINE_KEYS_DIR there."""
        out: dict[str, str] = {}
        for var, secret, key in pod.secret_env:
            value = self.secret_of(pod.namespace, secret, key)
            if value is None:
                return None
            out[var] = value
        if ENGINE_KEY_ENV in out:
            keys = self.state / "engine-keys"
            keys.mkdir(mode=0o700, exist_ok=True)
            path = keys / pod.upstream
            path.write_text(out[ENGINE_KEY_ENV])
            path.chmod(0o600)
        return out

    def _start(self, pod: PodView) -> None:
        gpu = self.gpu_of(pod.node) if pod.node else None
        port, kv_port = free_port(), free_port()
        secret_env = self._secret_env(pod)
        if secret_env is None:
            log(f"{pod.namespace}/{pod.name}: a Secret key its env names is missing (as the kubelet's "
                f"CreateContainerConfigError); retry in {RESTART_BACKOFF_S:g}s")
            self.crashed[pod.key] = time.monotonic() + RESTART_BACKOFF_S
            return
        # OCULIS_SIM_POD_PATHS: the pod's --lora-modules paths are its volumes, absent on this machine
        argv = sim_argv(self.oculis, pod, port, gpu, kv_port)
        env = {**os.environ, **dict(pod.env), **secret_env, "OCULIS_SIM_POD_PATHS": "1"}
        kv = f"tcp://{LOOPBACK}:{kv_port}" if kv_events_override(pod, kv_port) else None
        if pod.real:
            try:
                argv, env = self._real(pod, port)
                env.update(secret_env)
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                log(f"{pod.namespace}/{pod.name}: cannot run real vLLM: {exc}; retry in 60s")
                self.crashed[pod.key] = time.monotonic() + 60
                return
            if override := kv_events_override(pod, kv_port):
                argv.append(f"--kv-events-config={override}")
        with open(self._log(pod), "ab") as out:
            # A real engine is three processes: its own session, so stopping it stops them all.
            popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent, env=env, start_new_session=pod.real)
        self.procs[pod.key] = Proc(pod, port, popen, kv_events=kv)
        self.crashed.pop(pod.key, None)
        log(f"{pod.namespace}/{pod.name}: started pid {popen.pid} on {LOOPBACK}:{port} (gpu {gpu or '-'})")

    def _real(self, pod: PodView, port: int) -> tuple[list[str], dict[str, str]]:
        realvllm = _realvllm()
        venv = realvllm.venv_dir()
        if problem := realvllm.venv_problem(venv):
            raise RuntimeError(problem)
        model = realvllm.tiny_model(venv)
        return real_vllm_argv(str(venv / "bin" / "vllm"), str(model), pod, port), {**realvllm.engine_env(),
                                                                                    **dict(pod.env)}

    def _stop(self, key: str) -> None:
        proc = self.procs.pop(key)
        self.crashed.pop(key, None)
        if proc.popen.poll() is None:
            _signal(proc.popen, signal.SIGTERM)
            self.stopping.append((time.monotonic(), proc.popen))
        log(f"{proc.pod.namespace}/{proc.pod.name}: pod gone or not Running; stopped pid {proc.popen.pid}")

    def write(self) -> None:
        serving = [Serving(p.pod, p.port, p.popen.pid, p.kv_events) for p in self.procs.values() if p.ready]
        docs = (file_sd(serving), endpoint_map(serving, self.seen.values()))
        if docs != self._written:
            write_atomic(self.state / "targets.json", docs[0])
            write_atomic(self.state / "endpoints.json", docs[1])
            self._written = docs

    def shutdown(self) -> None:
        with self.lock:
            for key in list(self.procs):
                self._stop(key)
            self.pods = {}
            self.write()
            deadline = time.monotonic() + STOP_GRACE_S
            for _, p in self.stopping:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.1, deadline - time.monotonic()))
                if p.poll() is None:
                    _signal(p, signal.SIGKILL)


def _signal(p: subprocess.Popen[bytes], sig: int) -> None:
    """Signal a process, or its whole group when it leads one (a real engine's API server and workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(p.pid) == p.pid:
            os.killpg(p.pid, sig)
        else:
            p.send_signal(sig)


def _realvllm() -> Any:
    """tests/realengine/realvllm.py: where the engine virtualenv and the tiny model are, the engine's env."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realengine"))
    import realvllm

    return realvllm


# ---------------------------------------------------------------- the watch (thin shell)


def run(kubeconfig: Path, state: Path, namespaces: list[str], oculis: str) -> int:
    from kubernetes import client, config, watch

    # The client is untyped; its objects are read as Any and turned into PodViews at once.
    api: Any = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(api)
    products: dict[str, str | None] = {}
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def gpu_of(node: str) -> str | None:
        if node not in products:
            try:
                products[node] = (core.read_node(node).metadata.labels or {}).get(PRODUCT_LABEL)
            except client.ApiException:
                return None
        return products[node]

    def secret_of(namespace: str, name: str, key: str) -> str | None:
        import base64

        try:
            data = core.read_namespaced_secret(name, namespace).data or {}
        except client.ApiException:
            return None
        return base64.b64decode(data[key]).decode() if key in data else None

    standin = StandIn(state, oculis, gpu_of, secret_of=secret_of)

    def as_dict(obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = api.sanitize_for_serialization(obj)
        return out

    def watch_namespace(ns: str | None) -> None:
        """List, then watch from that version; relist on any error (a 410 Gone, the API restarting)."""
        views: dict[str, PodView] = {}
        while not stop.is_set():
            try:
                listed = (core.list_pod_for_all_namespaces(label_selector=SELECTOR) if ns is None
                          else core.list_namespaced_pod(ns, label_selector=SELECTOR))
                fresh = {v.key: v for v in (pod_view(as_dict(p)) for p in listed.items) if v}
                for gone in views.keys() - fresh.keys():  # deleted while the watch was down
                    standin.update("DELETED", views[gone])
                views = fresh
                for v in fresh.values():
                    standin.update("ADDED", v)
                w: Any = watch.Watch()  # type: ignore[no-untyped-call]
                fn = core.list_pod_for_all_namespaces if ns is None else core.list_namespaced_pod
                kwargs: dict[str, Any] = {"label_selector": SELECTOR, "timeout_seconds": 30,
                                          "resource_version": listed.metadata.resource_version}
                for event in w.stream(fn, *(() if ns is None else (ns,)), **kwargs):
                    if stop.is_set():
                        w.stop()
                        break
                    view = pod_view(as_dict(event["object"]))
                    if view is not None:
                        views[view.key] = view
                        if event["type"] == "DELETED":
                            views.pop(view.key, None)
                        standin.update(event["type"], view)
            except Exception as exc:  # the stand-in outlives API hiccups: relist after a pause
                if not stop.is_set():
                    log(f"watch {ns or 'all namespaces'}: {type(exc).__name__}: {str(exc)[:200]}; relisting")
                    stop.wait(1.0)

    threads = [threading.Thread(target=watch_namespace, args=(ns,), daemon=True)
               for ns in (namespaces or [None])]  # type: ignore[list-item]
    for t in threads:
        t.start()
    log(f"watching engine pods in {', '.join(namespaces) or 'all namespaces'}; files in {state}")
    while not stop.is_set():
        standin.reconcile()  # health probes, crashed processes, backoff restarts
        stop.wait(0.3)
    standin.shutdown()
    log("stopped every simulator")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="podstandin", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state", type=Path, required=True, help="directory for targets.json, endpoints.json, logs/")
    parser.add_argument("--namespace", action="append", default=[], help="watch only these (repeatable)")
    parser.add_argument("--oculis", default=str(Path(sys.executable).with_name("oculis")),
                        help="the oculis CLI that runs `oculis sim serve`")
    args = parser.parse_args(argv)
    if not Path(args.oculis).exists():
        print(f"podstandin: error: --oculis {args.oculis} does not exist; install the project (make install)",
              file=sys.stderr)
        return 2
    return run(args.kubeconfig, args.state, args.namespace, args.oculis)


if __name__ == "__main__":
    sys.exit(main())
