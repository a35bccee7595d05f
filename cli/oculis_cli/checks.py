"""The shell of `oculis status --check-deps`: reads the facts (Python modules, the cluster through the
kubeconfig, Prometheus, the baseline file) and hands them to oculis_measure.checks.core, which decides each line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from oculis_cli import checks_output as out
from oculis_measure.checks import core

DEFAULT_PROMETHEUS = "http://127.0.0.1:9090"
COLOURS = {core.PASS: "green", core.WARN: "yellow", core.FAIL: "bold red", core.SKIP: "dim"}
OPERATOR_SELECTOR = "app.kubernetes.io/name=oculis,app.kubernetes.io/component=operator"
WEBHOOK_CONFIG = "oculis.dev"
# What a rolling restart patches: the engine Deployments the operator renders, and the GPUUpstreams.
RESTART_ACCESS = (("patch", "apps", "deployments"), ("patch", "oculis.dev", "gpuupstreams"))


def kubeconfig_path(explicit: str | None) -> str | None:
    """The kubeconfig to use, or None when there is none at all."""
    if explicit:
        return explicit
    env = os.environ.get("KUBECONFIG")
    if env:
        return env.split(os.pathsep)[0]
    default = Path.home() / ".kube" / "config"
    return str(default) if default.is_file() else None


def add_flags(p: Any) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    p.add_argument("--namespace", "-n", default="default", help="namespace of the routes and upstreams to check")
    p.add_argument("--prometheus-url", help="Prometheus base URL (default: OCULIS_PROMETHEUS_URL, else "
                   f"{DEFAULT_PROMETHEUS} if it answers)")
    p.add_argument("--baseline", help="benchmark baseline JSON to check (oculis bench run --save)")
    p.add_argument("--suite", action="append", default=[], metavar="ROUTE=FILE",
                   help="a labelled suite of ROUTE's traffic (oculis eval run's offline format, with `kind`): its "
                   "routing quality per kind, WARN where the head is not better than random (repeatable)")
    p.add_argument("--config", type=Path, help="oculis-config.yaml of the --suite routes (default: the cluster's "
                   "InferenceRoutes in --namespace)")
    out.add_output_flag(p, with_csv=True)


def python_checks(required: set[str]) -> list[core.Check]:
    from oculis_cli.deps import EXTRAS, _version, check

    missing = {e.name: check(e) for e in EXTRAS}
    versions = {e.name: ", ".join(f"{m} {_version(m)}" for m in e.modules) for e in EXTRAS if not missing[e.name]}
    return core.extras_checks(missing, versions, required)


def cluster_checks(args: argparse.Namespace) -> tuple[list[core.Check], dict[str, Any]]:
    """The cluster's lines, and what the later checks need from it (routes, upstreams)."""
    path = kubeconfig_path(args.kubeconfig)
    facts: dict[str, Any] = {"routes": [], "upstreams": []}
    if path is None:
        return [core.cluster_check(None, None, None)], facts
    try:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException
    except ImportError:
        return [core.Check("cluster", "cluster reachable", core.FAIL, "the Kubernetes client is not installed",
                           "pip install 'oculis[operator]'")], facts
    try:
        api: Any = config.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
        server = api.configuration.host
        client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:  # ConfigException, urllib3 errors, OSError: all mean "cannot reach it"
        return [core.cluster_check(path, " ".join(str(exc).split())[:200], None)], facts
    checks = [core.cluster_check(path, None, server)]
    from oculis.crdgen import gpuupstream_crd, inferenceroute_crd

    ext = client.ApiextensionsV1Api(api)
    for expected in (gpuupstream_crd(), inferenceroute_crd()):
        name = expected["metadata"]["name"]
        try:
            installed = api.sanitize_for_serialization(ext.read_custom_resource_definition(name))
        except ApiException as exc:
            if exc.status != 404:  # forbidden (a namespaced user), or the server failed: say so, go on
                checks.append(core.unreadable("cluster", f"CRD {name}", f"customresourcedefinitions/{name}", exc))
                continue
            installed = None
        checks.append(core.crd_check(name, installed, expected))
    co: Any = client.CustomObjectsApi(api)
    for plural in ("inferenceroutes", "gpuupstreams"):
        with contextlib.suppress(ApiException):  # no CRD or not allowed: the lines above say which
            facts["routes" if plural == "inferenceroutes" else "upstreams"] = co.list_namespaced_custom_object(
                "oculis.dev", "v1alpha1", args.namespace, plural).get("items") or []
    objs = facts["routes"] + facts["upstreams"]
    stale = [f"{o['kind']}/{o['metadata']['name']}" for o in objs
             if (o.get("status") or {}).get("observedGeneration") != o["metadata"].get("generation")]
    try:
        pods: list[Any] = client.CoreV1Api(api).list_pod_for_all_namespaces(label_selector=OPERATOR_SELECTOR).items
    except ApiException as exc:
        if objs and not stale:  # the objects show an operator at work even where its pods cannot be listed
            checks.append(core.operator_check(0, 0, len(objs), []))
        else:
            checks.append(core.unreadable("cluster", "operator running", "pods in all namespaces", exc))
    else:
        ready = sum(any(c.type == "Ready" and c.status == "True" for c in ((p.status and p.status.conditions) or []))
                    for p in pods)
        checks.append(core.operator_check(ready, len(pods), len(objs) - len(stale), stale))
    try:
        hook = api.sanitize_for_serialization(
            client.AdmissionregistrationV1Api(api).read_validating_webhook_configuration(WEBHOOK_CONFIG))
        checks.append(core.webhook_check(hook))
    except ApiException as exc:
        checks.append(core.webhook_check(None) if exc.status == 404 else
                      core.unreadable("cluster", "admission webhook",
                                      f"validatingwebhookconfigurations/{WEBHOOK_CONFIG}", exc))
    facts["api"] = api
    return checks, facts


def routed_unpriced(facts: dict[str, Any]) -> dict[str, list[str]]:
    by_name = {u["metadata"]["name"]: u for u in facts["upstreams"]}
    out_: dict[str, list[str]] = {}
    for r in facts["routes"]:
        for t in (r.get("spec") or {}).get("tiers") or []:
            u = by_name.get(t.get("upstream"))
            p = ((u or {}).get("spec") or {}).get("pricing") or {}
            if not (p.get("inputPerMtok") or p.get("outputPerMtok") or p.get("gpuHourDollars")):
                out_.setdefault(t.get("upstream", "?"), []).append(r["metadata"]["name"])
    return out_


def spec_facts(facts: dict[str, Any]) -> list[core.SpecFacts]:
    from pydantic import ValidationError

    from oculis.upstream import GPUUpstreamSpec
    from oculis_operator.capacity_check import check

    found = []
    for u in facts["upstreams"]:
        raw = u.get("spec") or {}
        sp = ((raw.get("engine") or {}).get("speculative") or {})
        if not sp or sp.get("enabled") is False or raw.get("provider") != "vllm":
            continue
        name = u["metadata"]["name"]
        try:
            plan = check(GPUUpstreamSpec.model_validate(raw))
        except ValidationError as exc:
            found.append(core.SpecFacts(name, None, f"invalid spec: {exc.errors()[0]['msg']}", "InvalidSpec"))
            continue
        if isinstance(plan, tuple):
            found.append(core.SpecFacts(name, None, plan[1], plan[0]))
        else:
            found.append(core.SpecFacts(name, plan.fits, plan.message, plan.error_code))
    return found


def access(facts: dict[str, Any], namespace: str) -> list[core.Access]:
    from kubernetes import client

    out_ = []
    for verb, group, resource in RESTART_ACCESS:
        review = client.V1SelfSubjectAccessReview(spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(namespace=namespace, verb=verb, group=group,
                                                            resource=resource)))
        r: Any = client.AuthorizationV1Api(facts["api"]).create_self_subject_access_review(review)
        out_.append(core.Access(verb, f"{group}/{resource}", bool(r.status.allowed), r.status.reason or ""))
    return out_


def prometheus_lines(args: argparse.Namespace, self_hosted: int) -> list[core.Check]:
    url = args.prometheus_url or os.environ.get("OCULIS_PROMETHEUS_URL")
    try:
        from oculis_measure.prom import PromError, Prometheus
    except ImportError:
        return [core.Check("metrics", "Prometheus reachable", core.WARN, "httpx is not installed",
                           "pip install 'oculis[bench]'", required=False)]
    explicit = url is not None
    with Prometheus(url or DEFAULT_PROMETHEUS, timeout=5) as prom:
        try:
            prom.ready()
        except PromError as exc:
            return core.prometheus_checks(url if explicit else None, str(exc) if explicit else None, 0, 0, self_hosted)
        routers = prom.scalar('count({__name__=~"oculis_.+"})') or 0
        engines = prom.scalar('count({__name__=~"vllm:.+"})') or 0
    return core.prometheus_checks(prom.url, None, int(routers), int(engines), self_hosted, required=explicit)


def baseline_line(path: str | None) -> core.Check:
    if path is None:
        return core.baseline_check(None, None)
    try:
        data = json.loads(Path(path).read_text())
        # `oculis bench run --save` writes current + workload; `vllm bench serve --save-result` its throughputs.
        if not isinstance(data, dict) or not ({"current", "workload"} <= set(data) or "request_throughput" in data):
            raise ValueError("not an `oculis bench run --save` or `vllm bench serve --save-result` file")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        return core.baseline_check(path, " ".join(str(exc).split())[:200])
    return core.baseline_check(path, None)


def routing_lines(args: argparse.Namespace) -> list[core.Check]:
    """`--suite ROUTE=FILE`: each route's suite scored offline as `oculis eval run` scores it."""
    lines: list[core.Check] = []
    for spec in args.suite:
        route_name, _, path = spec.partition("=")
        if not route_name or not path:
            lines += core.routing_checks(spec or "?", spec, None, "--suite takes ROUTE=FILE, e.g. chat=suite.jsonl")
            continue
        lines += core.routing_checks(route_name, path, *_suite_kinds(args, route_name, Path(path)))
    return lines


def _suite_kinds(args: argparse.Namespace, route_name: str, path: Path) -> tuple[dict[str, Any] | None, str | None]:
    from oculis import ConfigError
    from oculis_cli.cost_sources import SourceError, load_catalog
    from oculis_cli.eval_run import offline_results
    from oculis_cli.inputs import InputError, read_text
    from oculis_measure.eval import core as eval_core
    from oculis_measure.eval import kinds

    try:
        route = load_catalog(args).config.route(route_name)
        items, errors = eval_core.parse_suite(read_text(path, "--suite").splitlines(), offline=True)
        results, more = offline_results(route, items, args.config)
    except (SourceError, ConfigError, InputError) as exc:
        return None, str(exc)
    if errors or more or not results:
        first = (errors + more)[:1] or ["no items to evaluate"]
        return None, f"{len(errors + more)} bad lines ({first[0]}); check it with oculis eval run"
    return kinds.report(eval_core.kind_items(results), route.tiers[0].name, route.tiers[-1].name), None


def run(args: argparse.Namespace, stdout: TextIO | None = None, python: bool = True) -> int:
    """Every check; `python=False` leaves out the extras (deps.py has printed them as text already)."""
    stdout = stdout or sys.stdout
    checks, facts = cluster_checks(args)
    if "api" in facts:
        checks += core.speculative_checks(spec_facts(facts))
        checks.append(core.pricing_check(routed_unpriced(facts)))
        try:
            checks += core.permission_checks(args.namespace, access(facts, args.namespace))
        except Exception as exc:  # an API server without the authorization API: say so, don't crash
            checks.append(core.Check("permissions", "rolling restart", core.WARN, f"cannot ask: {exc}",
                                     required=False))
    self_hosted = sum((u.get("spec") or {}).get("provider") == "vllm" for u in facts["upstreams"])
    checks += prometheus_lines(args, self_hosted)
    checks.append(baseline_line(args.baseline))
    checks += routing_lines(args)
    if python or args.output != "table":
        checks += python_checks(set(args.require))
    rep = core.Report(checks)
    if out.dump(rep.as_dict(), args.output, stdout):
        return 1 if core.failed(checks) else 0
    if args.output == "csv":
        out.write_csv([c.as_dict() for c in checks], stdout)
        return 1 if core.failed(checks) else 0
    out.table(None, ["status", "section", "check", "detail", "fix"],
              [[f"[{COLOURS.get(c.status, '')}]{c.status}[/]", c.section, c.name, c.detail, c.fix] for c in checks],
              stdout)
    d = rep.as_dict()["counts"]
    out.line(f"{d['PASS']} pass, {d['WARN']} warn, {d['FAIL']} fail, {d['SKIP']} skipped", stdout)
    return 1 if core.failed(checks) else 0
