"""The operator's own Prometheus metrics: what it reconciled, refused and failed to write, and how
many upstreams are Ready. Served on OCULIS_METRICS_PORT (the chart sets 9091); names `oculis_operator_*`."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):  # RSS and CPU of the operator
            collector(registry=self.registry)
        self.reconciles = Counter("oculis_operator_reconciles_total", "Reconciles of GPUUpstreams, by result",
                                  ["result"], registry=self.registry)
        self.refusals = Counter("oculis_operator_refusals_total",
                                "Engine changes refused before any pod restarted, by reason (counted once per change)",
                                ["reason"], registry=self.registry)
        self.api_requests = Counter("oculis_operator_api_requests_total",
                                    "Kubernetes API requests made by reconciles (watch streams not counted)",
                                    registry=self.registry)
        self.upstreams = Gauge("oculis_operator_upstreams", "GPUUpstreams known to this operator, by Ready status",
                               ["ready"], registry=self.registry)
        self.retrying = Gauge("oculis_operator_rechecks_pending",
                              "Upstreams waiting to be reconciled again (API error or missing Secret)",
                              registry=self.registry)
        self._ready: dict[tuple[str, str], bool] = {}

    def observe_upstream(self, key: tuple[str, str], ready: bool | None) -> None:
        """Record an upstream's Ready status (None: it is gone)."""
        if ready is None:
            self._ready.pop(key, None)
        else:
            self._ready[key] = ready
        n_ready = sum(self._ready.values())
        self.upstreams.labels("true").set(n_ready)
        self.upstreams.labels("false").set(len(self._ready) - n_ready)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
