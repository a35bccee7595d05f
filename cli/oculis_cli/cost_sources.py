"""Where the measurement commands get their inputs: the routes and prices (an `oculis-config.yaml`, or
the cluster's InferenceRoutes and GPUUpstreams rendered exactly as the operator renders them), and
the router's counters over a window (Prometheus). Thin I/O; every failure is one-line `SourceError`
(exit 2 for a bad input, 5 for something unreachable)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from oculis import ConfigError, Pricing, RouterConfig, parse_config
from oculis_cli.checks import DEFAULT_PROMETHEUS, kubeconfig_path
from oculis_cli.inputs import InputError, read_config
from oculis_measure.cost.core import Counters, GPUCost

EXIT_USAGE, EXIT_UNREACHABLE = 2, 5


class SourceError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Catalog:
    config: RouterConfig
    gpu: dict[str, GPUCost] = field(default_factory=dict)
    source: str = ""

    @property
    def pricing(self) -> dict[str, Pricing]:
        return {u.name: u.pricing for u in self.config.upstreams}


def add_source_flags(p: Any, prometheus: bool = True) -> None:
    p.add_argument("--config", type=Path, help="oculis-config.yaml (default: the cluster's InferenceRoutes and "
                   "GPUUpstreams in --namespace)")
    p.add_argument("--namespace", "-n", default="default", help="namespace of the routes (cluster mode)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG or ~/.kube/config)")
    if prometheus:
        p.add_argument("--prometheus-url", default=None,
                       help=f"Prometheus base URL (default: OCULIS_PROMETHEUS_URL or {DEFAULT_PROMETHEUS})")


def prometheus_url(args: Any) -> str:
    return str(args.prometheus_url or os.environ.get("OCULIS_PROMETHEUS_URL") or DEFAULT_PROMETHEUS)


def api_client(kubeconfig: str | None) -> Any:
    try:
        from kubernetes import config as kconfig
    except ImportError:
        raise SourceError("reading the cluster needs the Kubernetes client: pip install 'oculis[operator]', "
                          "or pass --config FILE", EXIT_USAGE) from None
    path = kubeconfig_path(kubeconfig)
    if path is None:
        raise SourceError("no kubeconfig (KUBECONFIG, ~/.kube/config): pass --config FILE or --kubeconfig",
                          EXIT_USAGE)
    try:
        return kconfig.new_client_from_config(config_file=path)  # type: ignore[no-untyped-call]
    except Exception as exc:  # the client raises ConfigException, OSError, YAML errors...
        raise SourceError(f"kubeconfig {path}: {' '.join(str(exc).split())[:300]}; fix it or pass --config FILE",
                          EXIT_USAGE) from None


def list_objects(api: Any, plural: str, namespace: str) -> list[dict[str, Any]]:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        out: Any = client.CustomObjectsApi(api).list_namespaced_custom_object("oculis.dev", "v1alpha1", namespace,
                                                                              plural)
    except ApiException as exc:
        raise SourceError(f"listing {plural} in {namespace}: HTTP {exc.status} {exc.reason}; install the CRDs "
                          "(kubectl apply -f crds/) or check your permissions", EXIT_UNREACHABLE) from None
    except (HTTPError, OSError) as exc:
        raise SourceError(f"the cluster is unreachable ({type(exc).__name__}); check the kubeconfig's context",
                          EXIT_UNREACHABLE) from None
    items: list[dict[str, Any]] = out.get("items") or []
    return items


def gpu_costs(upstreams: list[dict[str, Any]]) -> dict[str, GPUCost]:
    """pricing.gpuHourDollars x replicas x gpu.count of each self-hosted GPUUpstream that sets it."""
    out = {}
    for u in upstreams:
        spec = u.get("spec") or {}
        dollars = (spec.get("pricing") or {}).get("gpuHourDollars")
        if dollars is None or spec.get("provider") != "vllm":
            continue
        replicas = spec.get("replicas")
        gpus = int((1 if replicas is None else replicas) * ((spec.get("gpu") or {}).get("count") or 1))
        out[u["metadata"]["name"]] = GPUCost(float(dollars), gpus)
    return out


def load_catalog(args: Any) -> Catalog:
    if args.config is not None:
        try:
            return Catalog(read_config(args.config), source=str(args.config))
        except InputError as exc:
            raise SourceError(f"--config {exc}", EXIT_USAGE) from None
    api = api_client(args.kubeconfig)
    from oculis_operator.routeconfig import render_namespace

    routes = list_objects(api, "inferenceroutes", args.namespace)
    upstreams = list_objects(api, "gpuupstreams", args.namespace)
    if not routes:
        raise SourceError(f"no InferenceRoute in namespace {args.namespace}; pass -n NAMESPACE or --config FILE",
                          EXIT_USAGE)
    rendered = render_namespace(routes, upstreams)
    text = rendered.data.get("oculis-config.yaml", "")
    try:
        cfg = parse_config(text, f"namespace {args.namespace}")
    except ConfigError as exc:
        raise SourceError(f"the routes of {args.namespace} do not render a valid config: "
                          f"{' '.join(str(exc).split())[:300]}", EXIT_USAGE) from None
    return Catalog(cfg, gpu_costs(upstreams), source=f"cluster namespace {args.namespace}")


def counters(prom: Any, t0: datetime, t1: datetime, router_selector: str = "") -> Counters:
    """Every router counter's growth over [t0, t1], by its labels. `router_selector`, e.g.
    `job="oculis"`, narrows the series to some routers."""
    from oculis_measure.prom import PromError

    s, e = t0.timestamp(), t1.timestamp()
    sel = "{" + router_selector + "}" if router_selector else ""

    def by_upstream(name: str) -> dict[str, float]:
        return {k[0]: v for k, v in prom.deltas(f"{name}{sel}", ("upstream",), s, e).items()}

    try:
        reqs = prom.deltas(f"oculis_requests_total{sel}", ("route", "tier", "upstream", "outcome"), s, e)
        esc = prom.deltas(f"oculis_escalations_total{sel}", ("route", "reason"), s, e)
        routed = prom.deltas(f"oculis_routed_requests_total{sel}", ("route", "tier", "upstream"), s, e)
        replaced = prom.deltas(f"oculis_answers_replaced_total{sel}", ("route", "tier", "upstream"), s, e)
        grades = prom.deltas(f"oculis_answer_grades_total{sel}", ("route", "verifier", "outcome"), s, e)

        def by_pair(name: str, labels: tuple[str, str]) -> dict[tuple[str, str], float]:
            return {(k[0], k[1]): v for k, v in prom.deltas(f"{name}{sel}", labels, s, e).items()}

        def by_adapter(name: str) -> dict[tuple[str, str], float]:
            return {(k[0], k[1]): v for k, v in prom.deltas(f"{name}{sel}", ("upstream", "adapter"), s, e).items()}

        return Counters(
            routed={(k[0], k[1], k[2]): v for k, v in routed.items()},
            replaced={(k[0], k[1], k[2]): v for k, v in replaced.items()},
            gradings={(k[0], k[1], k[2]): v for k, v in grades.items()},
            requests={(k[0], k[1], k[2], k[3]): v for k, v in reqs.items()},
            prompt_tokens=by_upstream("oculis_prompt_tokens_total"),
            completion_tokens=by_upstream("oculis_completion_tokens_total"),
            cached_tokens=by_upstream("oculis_cached_prompt_tokens_total"),
            cache_write_tokens=by_upstream("oculis_cache_write_prompt_tokens_total"),
            cost=by_upstream("oculis_cost_dollars_total"),
            escalations={(k[0], k[1]): v for k, v in esc.items()},
            adapter_prompt_tokens=by_adapter("oculis_adapter_prompt_tokens_total"),
            adapter_completion_tokens=by_adapter("oculis_adapter_completion_tokens_total"),
            adapter_cost=by_adapter("oculis_adapter_cost_dollars_total"),
            batch_lines=by_pair("oculis_batch_lines_total", ("route", "outcome")),
            batch_tokens=by_pair("oculis_batch_tokens_total", ("route", "kind")),
            batch_cost=by_pair("oculis_batch_cost_dollars_total", ("route", "upstream")),
        )
    except PromError as exc:
        raise SourceError(str(exc), EXIT_UNREACHABLE) from None


def open_prometheus(args: Any) -> Any:
    """A ready Prometheus client; SourceError (exit 5) when it cannot be asked."""
    try:
        from oculis_measure.prom import PromError, Prometheus
    except ImportError:
        raise SourceError("Prometheus queries need httpx: pip install 'oculis[bench]'", EXIT_USAGE) from None
    prom = Prometheus(prometheus_url(args))
    try:
        prom.ready()
    except PromError as exc:
        prom.close()
        raise SourceError(str(exc), EXIT_UNREACHABLE) from None
    return prom
