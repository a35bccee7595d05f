"""The router's default metrics port is not Prometheus's own default (QA3 Part 2 #11): `oculis serve` listened
on 9090, the port a local Prometheus takes by default and the analysis commands' default --prometheus-url,
while `status --check-deps` told the user the router's metrics port was 9464. One default, said the same way."""

from __future__ import annotations

from urllib.parse import urlsplit

from oculis_cli.checks import DEFAULT_PROMETHEUS
from oculis_cli.main import build_parser
from oculis_cli.serve import DEFAULT_METRICS_PORT
from oculis_measure.checks.core import prometheus_checks


def test_the_router_metrics_port_is_not_prometheus_s_and_the_fix_names_it() -> None:
    args = build_parser().parse_args(["serve", "--config", "c.yaml"])
    assert args.metrics_port == DEFAULT_METRICS_PORT != urlsplit(DEFAULT_PROMETHEUS).port
    failed = [c for c in prometheus_checks("http://127.0.0.1:9090", None, 0, 0, 0) if c.name == "scrapes routers"]
    assert f"default {DEFAULT_METRICS_PORT}" in failed[0].fix and "--metrics-port" in failed[0].fix
