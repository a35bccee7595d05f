"""LoRA adapters loaded on running engines without a restart (issue 26, "Loading"). Pure: no I/O.

vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True loads and unloads adapters through its API
(`POST /v1/load_lora_adapter {lora_name, lora_path}`, `POST /v1/unload_lora_adapter {lora_name}`) and
lists the loaded ones in `/v1/models` (entries with a `parent`, `root` their path). The operator's
shell (adapter_sync.py) reads each ready engine pod's list; `plan` says what to load and unload where,
`after` what each pod holds once that was done, and `report` / `status_of` how ready each declared
adapter is (ready when every ready replica holds it) for `status.adapters`, the ADAPTERS column and the
`AdaptersReady` condition.

Errors stay per adapter: an adapter the engine will not load (its source cannot be fetched, say) is
reported with the engine's own words and the others keep serving; nothing is restarted or deleted for
it. A load the engine refused is asked again only after RETRY_S (asking sooner repeats the answer; a
source can still appear later: a PVC filled, a repository made public). An adapter held in a PVC or
ConfigMap is loaded only on pods that mount its volume (a pod mounts volumes when it starts, so a new
one rolls the pods); elsewhere it waits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

RETRY_S = 60.0  # a refused load is asked again after this long


@dataclass(frozen=True)
class Want:
    """A declared adapter: the lora_path the engine gets, and the mount its volume needs (None: none)."""

    name: str
    path: str
    mount: str | None = None


@dataclass(frozen=True)
class Pod:
    """One ready engine pod: what it has loaded (adapter -> path, from its /v1/models), or why that could
    not be read (`loaded` None); the adapter mounts its pod spec has."""

    name: str
    loaded: Mapping[str, str] | None
    problem: str | None = None
    mounts: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Failure:
    """The engine's last refusal to load an adapter on one pod."""

    path: str
    reason: str
    at: float


@dataclass(frozen=True)
class Action:
    pod: str
    verb: Literal["load", "unload"]
    adapter: str
    path: str = ""
    inplace: bool = False  # loaded from another path: replaced under the same name (vLLM's load_inplace)

    def body(self) -> dict[str, Any]:
        """The JSON body vLLM 0.32's endpoint takes."""
        if self.verb == "unload":
            return {"lora_name": self.adapter}
        return {"lora_name": self.adapter, "lora_path": self.path, **({"load_inplace": True} if self.inplace else {})}

    def __str__(self) -> str:
        return f"{self.verb} {self.adapter!r}" + (f" from {self.path}" if self.verb == "load" else "") + \
            f" on pod {self.pod}"


Failures = dict[tuple[str, str], Failure]  # (pod, adapter) -> the engine's last refusal


def plan(wants: Iterable[Want], pods: Iterable[Pod], failures: Mapping[tuple[str, str], Failure], now: float,
         runtime: bool = True) -> list[Action]:
    """Per readable pod: load each declared adapter it lacks (or holds from another path) where its volume
    is mounted, unless the engine refused that very load less than RETRY_S ago; unload what it holds that
    is not declared. Without `runtime` (adapters are --lora-modules flags) nothing is asked: the pods roll."""
    if not runtime:
        return []
    wanted = {w.name: w for w in wants}
    out: list[Action] = []
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.loaded is None:
            continue
        for w in wanted.values():
            have = pod.loaded.get(w.name)
            if have == w.path or (w.mount is not None and w.mount not in pod.mounts):
                continue
            f = failures.get((pod.name, w.name))
            if f is not None and f.path == w.path and now - f.at < RETRY_S:
                continue
            out.append(Action(pod.name, "load", w.name, w.path, inplace=have is not None))
        out += [Action(pod.name, "unload", name) for name in sorted(pod.loaded) if name not in wanted]
    return out


def after(pods: Iterable[Pod], done: Iterable[tuple[Action, str | None]]) -> list[Pod]:
    """What each pod holds once the actions ran: (action, None) succeeded, (action, error) did not."""
    held = {p.name: dict(p.loaded) if p.loaded is not None else None for p in pods}
    for action, error in done:
        loaded = held.get(action.pod)
        if error is not None or loaded is None:
            continue
        if action.verb == "load":
            loaded[action.adapter] = action.path
        else:
            loaded.pop(action.adapter, None)
    return [Pod(p.name, held[p.name], p.problem, p.mounts) for p in pods]


def record(failures: Failures, done: Iterable[tuple[Action, str | None]], pods: Iterable[Pod],
           now: float, wants: Iterable[Want]) -> Failures:
    """The failures to remember: a refused load (RETRY_S counts from it); forgotten once the pod holds the
    adapter, the pod is gone or the adapter is no longer declared from that path."""
    out = dict(failures)
    for action, error in done:
        if action.verb != "load":
            continue
        key = (action.pod, action.adapter)
        if error is None:
            out.pop(key, None)
        else:
            out[key] = Failure(action.path, error, now)
    present = {p.name: p for p in pods}
    paths = {w.name: w.path for w in wants}
    for key in list(out):
        pod = present.get(key[0])
        if pod is None or paths.get(key[1]) != out[key].path or (
                pod.loaded is not None and pod.loaded.get(key[1]) == out[key].path):
            del out[key]
    return out


@dataclass(frozen=True)
class Readiness:
    name: str
    ready: int  # ready pods holding it
    pods: int  # ready pods
    reason: str | None = None  # why not on every one of them
    failed: bool = False  # the engine refused it (not merely waiting)

    @property
    def ok(self) -> bool:
        return self.pods > 0 and self.ready == self.pods


@dataclass(frozen=True)
class Report:
    """The declared adapters on the ready pods, as the shell last saw them."""

    adapters: tuple[Readiness, ...]
    pods: int
    unreadable: tuple[str, ...] = field(default=())  # "pod: why" for ready pods whose adapters could not be read


def report(wants: Iterable[Want], pods: Iterable[Pod], failures: Mapping[tuple[str, str], Failure]) -> Report:
    pods = list(pods)
    unreadable = tuple(f"pod {p.name}: {p.problem or 'adapters not read'}" for p in pods if p.loaded is None)
    out = []
    for w in wants:
        holding = [p for p in pods if p.loaded is not None and p.loaded.get(w.name) == w.path]
        refused = sorted((pod, f.reason) for (pod, name), f in failures.items() if name == w.name and f.path == w.path)
        reason = None
        if refused:
            pod, why = refused[0]
            more = f" (and {len(refused) - 1} other pod(s))" if len(refused) > 1 else ""
            reason = f"the engine refused to load it from {w.path} on pod {pod}{more}: {why}"
        elif len(holding) < len(pods):
            unmounted = [p.name for p in pods if w.mount is not None and w.mount not in p.mounts]
            if unmounted:
                reason = (f"waiting for replicas that mount its volume at {w.mount} (a PVC or ConfigMap adapter "
                          f"needs a pod restart to mount it; not mounted on {', '.join(sorted(unmounted))})")
            elif unreadable:
                reason = f"its replicas' adapters could not be read: {'; '.join(unreadable)}"
            else:
                reason = "loading"
        elif not pods:
            reason = "no ready replica"
        out.append(Readiness(w.name, len(holding), len(pods), reason, failed=bool(refused)))
    return Report(tuple(out), len(pods), unreadable)


def status_of(declared: list[str], rep: Report | None) -> tuple[list[dict[str, Any]], str, tuple[str, str, str],
                                                                 tuple[str, str] | None]:
    """(status.adapters, status.adaptersReady, the AdaptersReady condition (status, reason, message), the
    Warning to post or None) for the declared adapters; an adapter the report does not know yet (just
    added) is not ready, reason "loading"."""
    known = {r.name: r for r in rep.adapters} if rep is not None else {}
    rows = [known.get(n) or Readiness(n, 0, rep.pods if rep else 0, "loading" if rep else "not checked yet")
            for n in declared]
    entries = [{"name": r.name, "ready": r.ready, **({} if r.ok or not r.reason else {"reason": r.reason})}
               for r in rows]
    ready = sum(1 for r in rows if r.ok)
    summary = f"{ready}/{len(rows)}"
    if not rows:
        return entries, summary, ("True", "NoAdapters", "no adapter declared; the engine serves LoRA when one is"), None
    if rep is not None and rep.pods == 0:
        return entries, summary, ("False", "NoReadyReplicas", "no ready replica to load adapters on"), None
    failed = [r for r in rows if r.failed]
    if failed:
        msg = "; ".join(f"adapter {r.name!r}: {r.reason}" for r in failed) + \
            (f"; the other {ready} adapter(s) serve" if ready else "") + \
            "; fix its source in spec.adapters (nothing is restarted for it; it is tried again every minute)"
        return entries, summary, ("False", "AdapterLoadFailed", msg), ("AdapterLoadFailed", msg)
    waiting = [r for r in rows if not r.ok]
    if waiting:
        msg = "; ".join(f"adapter {r.name!r} on {r.ready}/{r.pods} ready replicas: {r.reason}" for r in waiting)
        return entries, summary, ("False", "Loading", msg), None
    pods = rows[0].pods
    return entries, summary, ("True", "AllLoaded", f"{len(rows)} adapter(s) on all {pods} ready replica(s)"), None


def volume_roll(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Said with a roll whose templates (Deployments) differ in their adapter volumes (`lora-*`): a PVC or
    ConfigMap adapter added or removed restarts the pods, as only a new pod can mount or drop a volume."""
    def names(dep: dict[str, Any]) -> set[str]:
        volumes = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []
        return {str(v.get("name")) for v in volumes if str(v.get("name", "")).startswith("lora-")}

    if names(before) == names(after):
        return ""
    return "; a PVC or ConfigMap adapter was added or removed: only new pods can mount or drop its volume"
