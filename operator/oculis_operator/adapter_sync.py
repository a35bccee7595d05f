"""The shell of runtime adapter loading: read each ready engine pod's adapters (`GET /v1/models`), ask it
to load or unload (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`, vLLM 0.32's API), and keep
what the engines refused; adapter_loading.py decides what to ask. Standard library HTTP (the operator
image has no HTTP client of the router's), short timeouts, a connection retried a few times (tenacity).

How a pod's engine is reached: its pod IP on the engine port (engine_args.PORT), only from inside the
cluster (the operator's own pod: KUBERNETES_SERVICE_HOST is set). With OCULIS_ENGINE_ENDPOINTS=FILE (the
sandbox, where pod IPs are fake and never dialled) only the file is used: the pod stand-in's endpoint
map (e2e/podstandin.py) gives each pod's 127.0.0.1 port, and a pod it does not list is not reached at
all. An operator run outside the cluster without the file reaches no engine (and says so per adapter).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from oculis import endpoint_map
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import access_sync
from oculis_operator import adapter_loading as core
from oculis_operator.engine_args import PORT
from oculis_operator.kube import Kube

ENDPOINTS_ENV = "OCULIS_ENGINE_ENDPOINTS"
LOOPBACK = "127.0.0.1"
READ_TIMEOUT_S = 3.0  # /v1/models and unload answer at once
LOAD_TIMEOUT_S = 60.0  # a load may download the adapter first (Hugging Face); a timeout is checked next pass
log = logging.getLogger("oculis.operator")


def wants(spec: GPUUpstreamSpec) -> list[core.Want]:
    return [core.Want(a.name, a.module_path(), a.mount_path()) for a in spec.adapters or []]


def loopback_ports(path: Path) -> dict[tuple[str, str], int]:
    """(namespace, pod) -> its 127.0.0.1 port, from the endpoint map (`oculis.endpoint_map`, the router's
    reader too); nothing when the file cannot be read or parsed (the stand-in writes it atomically, so a
    read sees a whole map)."""
    try:
        served = endpoint_map.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, endpoint_map.EndpointMapError):
        return {}
    return {(s.namespace, p.pod): p.port for s in served.values() for p in s.pods}


NO_IP = "no pod IP yet"
NOT_LISTED = f"not in the endpoint map ({ENDPOINTS_ENV}) yet"
OUTSIDE = (f"the operator runs outside the cluster, where pod IPs are not reachable: run it in the cluster, or "
           f"set {ENDPOINTS_ENV} to an endpoint map of the pods' local ports")


def engine_url(pod: dict[str, Any], overrides: dict[tuple[str, str], int] | None,
               in_cluster: bool = True) -> tuple[str | None, str]:
    """(the pod's engine base URL, or None and why it cannot be reached)."""
    meta = pod.get("metadata") or {}
    if overrides is not None:
        port = overrides.get((meta.get("namespace", ""), meta.get("name", "")))
        return (f"http://{LOOPBACK}:{port}", "") if port else (None, NOT_LISTED)
    if not in_cluster:
        return None, OUTSIDE
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None, NO_IP
    return (f"http://[{ip}]:{PORT}" if ":" in ip else f"http://{ip}:{PORT}"), ""


def ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    return (status.get("phase") == "Running" and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []))


def adapter_mounts(pod: dict[str, Any]) -> frozenset[str]:
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return frozenset(str(m.get("mountPath")) for m in containers[0].get("volumeMounts") or [] if m.get("mountPath"))


def _refused(exc: BaseException) -> bool:
    """Worth another try at once: the connection failed (a restarting server). Not an HTTP answer, and
    not a timeout (the engine may still be loading; the next pass sees it)."""
    return isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError) and \
        isinstance(exc.reason, ConnectionError)


_retry = retry(retry=retry_if_exception(_refused), stop=stop_after_attempt(3),
               wait=wait_exponential(multiplier=0.2, max=1), reraise=True)


@_retry
def _request(url: str, body: dict[str, Any] | None, timeout: float, key: str | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data else {}
    if key:  # the engine's API key (engine_access): its /v1 refuses the call without it; never logged
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        out: bytes = resp.read()
        return out


def _why(exc: Exception) -> str:
    """An engine's refusal in its own words (vLLM's {"error": {"message"}}), or the transport's."""
    if isinstance(exc, urllib.error.HTTPError):
        try:
            body = json.loads(exc.read())
        except (ValueError, OSError):
            body = None
        if exc.code == 404 and body == {"detail": "Not Found"}:  # FastAPI: no such route
            return (f"the engine has no {exc.url.rsplit('/', 1)[-1]} endpoint (HTTP 404): "
                    "VLLM_ALLOW_RUNTIME_LORA_UPDATING is not true in its environment; set engine.runtimeLoraUpdating:"
                    " false to name adapters at start instead, or use an image that keeps the variable")
        try:
            message = body["error"]["message"]
        except (KeyError, TypeError):
            message = exc.reason
        return f"{message} (HTTP {exc.code})"
    if isinstance(exc, urllib.error.URLError):
        return f"engine not reachable: {exc.reason}"
    return f"engine not reachable: {exc}"


def read_pod(name: str, url: str | None, unreachable: str = NO_IP, mounts: frozenset[str] = frozenset(),
             key: str | None = None) -> core.Pod:
    """The adapters the pod's engine lists in /v1/models (entries with a parent: the LoRAs)."""
    if url is None:
        return core.Pod(name, None, unreachable, mounts)
    try:
        doc = json.loads(_request(f"{url}/v1/models", None, READ_TIMEOUT_S, key))
        loaded = {str(m["id"]): str(m.get("root") or "") for m in doc["data"] if m.get("parent")}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return core.Pod(name, None, _why(exc), mounts)
    return core.Pod(name, loaded, None, mounts)


def call(url: str, action: core.Action, key: str | None = None) -> str | None:
    """Ask the engine; None when done (an unload of what is gone, or a load of what is there, counts as done:
    the next read shows the truth), else its answer."""
    try:
        _request(f"{url}/v1/{action.verb}_lora_adapter", action.body(),
                 LOAD_TIMEOUT_S if action.verb == "load" else READ_TIMEOUT_S, key)
    except urllib.error.HTTPError as exc:
        why = _why(exc)
        if (action.verb == "unload" and "cannot be found" in why) or "has already been loaded" in why:
            return None
        return why
    except (OSError, ValueError) as exc:
        return _why(exc)
    return None


@dataclass
class State:
    """What one upstream's sync remembers between passes."""

    failures: core.Failures = field(default_factory=dict)
    report: core.Report | None = None


def sync(spec: GPUUpstreamSpec, pods: list[dict[str, Any]], state: State, now: float,
         overrides: dict[tuple[str, str], int] | None, in_cluster: bool = True, key: str | None = None
         ) -> tuple[State, list[str]]:
    """One pass over the upstream's ready pods: read, act, report. Returns the new state and what was done
    (one line per adapter and verb, for the log and a Normal Event). `key`: the engines' API key."""
    serving = [p for p in pods if ready(p)]
    found = {p["metadata"]["name"]: engine_url(p, overrides, in_cluster) for p in serving}
    urls = {name: url for name, (url, _) in found.items()}
    seen = []
    for p in serving:
        name = p["metadata"]["name"]
        seen.append(read_pod(name, *found[name], mounts=adapter_mounts(p), key=key))
    want = wants(spec)
    actions = core.plan(want, seen, state.failures, now, spec.runtime_adapters)
    done = []
    for action in actions:
        url = urls.get(action.pod)
        done.append((action, call(url, action, key) if url else "no address for its engine"))
    held = core.after(seen, done)
    failures = core.record(state.failures, done, held, now, want)
    return State(failures, core.report(want, held, failures)), summary(done)


def summary(done: list[tuple[core.Action, str | None]]) -> list[str]:
    """One line per adapter and verb done (refusals are the AdaptersReady condition's and its Warning's)."""
    pods: dict[tuple[str, str], list[str]] = {}
    for action, error in done:
        if error is None:
            pods.setdefault((action.adapter, action.verb), []).append(action.pod)
    return [f"{'Loaded' if verb == 'load' else 'Unloaded'} adapter {adapter!r} on {len(on)} replica(s) "
            f"({', '.join(sorted(on))}) without a restart" for (adapter, verb), on in sorted(pods.items())]


def overrides_from_env() -> dict[tuple[str, str], int] | None:
    """The endpoint map named by OCULIS_ENGINE_ENDPOINTS, re-read each pass; None when unset (pod IPs)."""
    path = os.environ.get(ENDPOINTS_ENV)
    return loopback_ports(Path(path)) if path else None


def pass_one(kube: Kube, key: tuple[str, str], spec: GPUUpstreamSpec, state: State) -> tuple[State, list[str]]:
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))  # set in every pod by the kubelet
    engine_key = access_sync.engine_key(kube, *key) if spec.engine_api_key else None
    return sync(spec, kube.engine_pods(*key), state, time.time(), overrides_from_env(), in_cluster, engine_key)


async def run(kube: Kube, changed: Callable[[str, str], Awaitable[None]], interval: float) -> None:
    """Every `interval` seconds, and at once when a reconcile calls kube.adapter_wake (a spec's adapters
    changed), one pass over each LoRA upstream the reconciles registered (kube.lora_upstreams); when what
    its engines hold changed, the report is kept for the reconcile (kube.adapter_reports), the lines done
    for its Events (kube.adapter_log), and `changed` called."""
    states: dict[tuple[str, str], State] = {}
    failing: dict[tuple[str, str], str] = {}
    loop, wake = asyncio.get_running_loop(), asyncio.Event()
    kube.adapter_wake = lambda: loop.call_soon_threadsafe(wake.set)  # reconciles run in threads
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), interval)
        wake.clear()
        upstreams = dict(kube.lora_upstreams)
        for key, spec in sorted(upstreams.items()):
            try:
                new, lines = await asyncio.to_thread(pass_one, kube, key, spec, states.get(key) or State())
            except Exception as exc:  # an API error listing pods: tried again next pass, said once
                line = f"adapter pass failed, retrying every {interval:g} s: {str(exc).splitlines()[0][:300]}"
                if failing.get(key) != line:
                    log.warning(f"[{key[0]}/{key[1]}] {line}")
                failing[key] = line
                continue
            failing.pop(key, None)
            states[key] = new
            if lines or new.report != kube.adapter_reports.get(key):
                kube.adapter_reports[key] = new.report
                kube.adapter_log.setdefault(key, []).extend(lines)
                await changed(*key)
        for key in set(states) - upstreams.keys():
            del states[key]
