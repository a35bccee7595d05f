"""`oculis status --check-deps`: each prerequisite as PASS / WARN / FAIL with its fix. Pure functions
from facts (what the shell read from the cluster, Prometheus and the filesystem) to check lines.

A FAIL of a required check makes the command exit 1; WARN never does (something optional is missing,
or could not be seen from here)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Check:
    section: str
    name: str
    status: str
    detail: str
    fix: str = ""
    required: bool = True

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def failed(checks: Iterable[Check]) -> bool:
    return any(c.status == FAIL and c.required for c in checks)


def extras_checks(missing: dict[str, list[str]], versions: dict[str, str], required: set[str]) -> list[Check]:
    """One line per Python extra: missing modules (FAIL only when --require names the extra)."""
    out = []
    for extra, mods in missing.items():
        if mods:
            out.append(Check("python", f"extra {extra}", FAIL if extra in required else WARN,
                             f"missing {', '.join(mods)}", f"pip install 'oculis[{extra}]'", extra in required))
        else:
            out.append(Check("python", f"extra {extra}", PASS, versions.get(extra, ""), required=extra in required))
    return out


def cluster_check(kubeconfig: str | None, error: str | None, server: str | None) -> Check:
    if kubeconfig is None:
        return Check("cluster", "cluster reachable", SKIP, "no kubeconfig found: cluster checks skipped",
                     "set KUBECONFIG or pass --kubeconfig to check a cluster", required=False)
    if error is not None:
        return Check("cluster", "cluster reachable", FAIL, f"{server or kubeconfig}: {error}",
                     "check the kubeconfig's current context and that the API server is up")
    return Check("cluster", "cluster reachable", PASS, f"API server {server}")


def unreadable(section: str, name: str, what: str, exc: Any) -> Check:
    """A check this kubeconfig may not read (HTTP 403) or the server did not answer: WARN, since the
    prerequisite may well be there; the fix says what to ask for."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None) or str(exc)
    why = "forbidden" if status == 403 else f"HTTP {status} {reason}".strip()
    return Check(section, name, WARN, f"cannot read {what}: {why}",
                 "run with a kubeconfig that may get/list it, or ask an admin to run this check", required=False)


def crd_check(name: str, installed: dict[str, Any] | None, expected: dict[str, Any]) -> Check:
    """The installed CRD serves our version with our schema (the generated one is the truth)."""
    if installed is None:
        return Check("cluster", f"CRD {name}", FAIL, "not installed", "kubectl apply --server-side -f crds/")
    versions = {v.get("name"): v for v in (installed.get("spec") or {}).get("versions") or []}
    want = expected["spec"]["versions"][0]
    have = versions.get(want["name"])
    if have is None:
        return Check("cluster", f"CRD {name}", FAIL, f"does not serve {want['name']} (serves "
                     f"{', '.join(str(v) for v in versions) or 'nothing'})", "kubectl apply --server-side -f crds/")
    if have.get("schema") != want.get("schema"):
        return Check("cluster", f"CRD {name}", WARN, f"{want['name']} installed, but its schema differs from this "
                     "oculis's (another version)", "kubectl apply --server-side -f crds/ from this release")
    return Check("cluster", f"CRD {name}", PASS, f"{want['name']}, schema matches this version")


def operator_check(ready_pods: int, pods: int, reconciled: int, stale: list[str]) -> Check:
    """Operator pods Ready, or (an operator outside the cluster, as in development) every Oculis object
    reconciled at its current generation."""
    if ready_pods:
        return Check("cluster", "operator running", PASS, f"{ready_pods}/{pods} operator pods Ready")
    if reconciled and not stale:
        return Check("cluster", "operator running", PASS, f"no operator pod, but all {reconciled} Oculis objects "
                     "are reconciled at their current generation (an operator outside the cluster)")
    why = f"{pods} operator pods, none Ready" if pods else "no operator pod"
    if stale:
        why += f"; not reconciled: {', '.join(stale[:5])}"
    return Check("cluster", "operator running", FAIL, why, "helm install oculis charts/oculis (or run the operator: "
                 "kopf run -m oculis_operator.handlers --all-namespaces)")


def webhook_check(config: dict[str, Any] | None) -> Check:
    if config is None:
        return Check("cluster", "admission webhook", SKIP, "not enabled (ValidatingWebhookConfiguration oculis.dev "
                     "absent)", "optional: helm upgrade ... --set operator.webhook.enabled=true", required=False)
    hooks = config.get("webhooks") or []
    if not hooks:
        return Check("cluster", "admission webhook", FAIL, "oculis.dev has no webhooks",
                     "restart the operator so that kopf re-registers them")
    return Check("cluster", "admission webhook", PASS, f"{len(hooks)} webhooks registered")


def prometheus_checks(url: str | None, error: str | None, router_series: int, engine_series: int,
                      self_hosted: int, required: bool = True) -> list[Check]:
    """Prometheus reachable, and scraping the routers (oculis_*) and, when any upstream is self-hosted,
    the engines (vllm:*). `required=False` (a Prometheus found on the default address, not named by
    the user): what it lacks is a WARN, since it may be some other Prometheus."""
    if not required:
        return [Check(x.section, x.name, WARN if x.status == FAIL else x.status, x.detail, x.fix, required=False)
                for x in prometheus_checks(url, error, router_series, engine_series, self_hosted)]
    if url is None:
        return [Check("metrics", "Prometheus reachable", WARN, "no --prometheus-url and none found",
                      "pass --prometheus-url or set OCULIS_PROMETHEUS_URL", required=False)]
    if error is not None:
        return [Check("metrics", "Prometheus reachable", FAIL, error, "start Prometheus or fix --prometheus-url")]
    out = [Check("metrics", "Prometheus reachable", PASS, url)]
    out.append(Check("metrics", "scrapes routers", PASS, f"{router_series} oculis_* series") if router_series else
               Check("metrics", "scrapes routers", FAIL, "no oculis_* series (the router's metrics port is not a "
                     "target, or it has served nothing yet)", "add the router's metrics port (`oculis serve "
                     "--metrics-port`, default 9464; the chart's 9090) to Prometheus's scrape targets and send a "
                     "request"))
    if self_hosted:
        out.append(Check("metrics", "scrapes engines", PASS, f"{engine_series} vllm:* series") if engine_series else
                   Check("metrics", "scrapes engines", FAIL, f"{self_hosted} self-hosted upstreams, but no vllm:* "
                         "series", "scrape the engine pods' :8000/metrics (prometheus.io/scrape annotations)"))
    return out


def pricing_check(unpriced: dict[str, list[str]]) -> Check:
    """`unpriced`: upstream -> routes that use it, for upstreams without any token price."""
    if not unpriced:
        return Check("cost", "pricing on every routed upstream", PASS, "every upstream a route uses has pricing")
    listed = "; ".join(f"{u} (route {', '.join(sorted(rs))})" for u, rs in sorted(unpriced.items()))
    return Check("cost", "pricing on every routed upstream", WARN, f"no pricing: {listed}; cost metrics count $0",
                 "set spec.pricing.inputPerMtok/outputPerMtok on these GPUUpstreams", required=False)


def baseline_check(path: str | None, error: str | None) -> Check:
    if path is None:
        return Check("bench", "benchmark baseline", WARN, "no --baseline given",
                     "oculis bench run ... --save baseline.json, then --baseline baseline.json", required=False)
    if error is not None:
        return Check("bench", "benchmark baseline", FAIL, f"{path}: {error}",
                     "save one with oculis bench run ... --save FILE")
    return Check("bench", "benchmark baseline", PASS, path)


def routing_checks(route: str, suite: str, kinds: dict[str, Any] | None, error: str | None) -> list[Check]:
    """`--suite ROUTE=FILE`: the route's routing quality per kind of the suite (eval/kinds.py's report),
    one line per kind; a kind the head is not shown to route better than random is a WARN naming it."""
    name = f"route {route} routes better than random"
    if error is not None or kinds is None:
        return [Check("routing", name, FAIL, f"{suite}: {error}",
                      "fix the suite (oculis eval run's offline format: prompt|messages, outcomes, kind)")]
    out = []
    for row in kinds["rows"]:
        if row["kind"] == "all" and len(kinds["rows"]) > 1:
            continue
        figures = (f"APGR {row['apgr']:.3f} [{row['ci'][0]:.3f}, {row['ci'][1]:.3f}], CPT(50%) {row['cpt50']:.3f}, "
                   f"n={row['scored']}: " if row["apgr"] is not None and row["ci"] else f"n={row['scored']}: ")
        status = {"OK": PASS, "WARN": WARN}.get(row["verdict"], SKIP)
        fix = "" if status != WARN else ("oculis classifier fit --suite FILE ... (your labelled outcomes), or "
                                         "escalation.on_answer on the route")
        out.append(Check("routing", f"{name} on {row['kind']}", status, f"{figures}{row['reason']} ({suite})", fix,
                         required=False))
    return out


@dataclass(frozen=True)
class SpecFacts:
    upstream: str
    fits: bool | None  # None: could not be planned
    message: str
    code: str | None = None  # TokenizerMismatch, UnknownModel, ...


def speculative_checks(facts: list[SpecFacts]) -> list[Check]:
    out = []
    for f in facts:
        if f.fits:
            out.append(Check("engines", f"speculative decoding {f.upstream}", PASS, f.message))
        else:
            fix = ("pick a draft of the target's family (same tokenizer) or speculative.method: ngram"
                   if f.code == "TokenizerMismatch" else "see the message; lower maxModelLen/maxNumSeqs or add GPUs")
            out.append(Check("engines", f"speculative decoding {f.upstream}", FAIL, f.message, fix))
    return out


@dataclass(frozen=True)
class Access:
    verb: str
    resource: str  # group/resource, e.g. apps/deployments
    allowed: bool
    reason: str = ""


def permission_checks(namespace: str, access: list[Access]) -> list[Check]:
    out = []
    for a in access:
        name = f"may {a.verb} {a.resource} in {namespace}"
        out.append(Check("permissions", name, PASS, "allowed") if a.allowed else
                   Check("permissions", name, FAIL, f"denied{': ' + a.reason if a.reason else ''}",
                         f"grant {a.verb} on {a.resource} (a Role bound to you) for rolling restarts"))
    return out


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        counts = {s: sum(c.status == s for c in self.checks) for s in (PASS, WARN, FAIL, SKIP)}
        return {"ok": not failed(self.checks), "counts": counts, "checks": [c.as_dict() for c in self.checks]}
