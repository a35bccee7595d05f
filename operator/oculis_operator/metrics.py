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
        # The seed's names for the speculative-decoding guard: what it measured, per upstream.
        self.spec_acceptance = Gauge("oculis_speculative_acceptance_rate",
                                     "Speculative decoding: accepted / draft tokens over the guard's window",
                                     ["namespace", "upstream"], registry=self.registry)
        self.spec_accepted = Counter("oculis_speculative_tokens_accepted",
                                     "Speculative decoding: draft tokens the target accepted (all engine pods)",
                                     ["namespace", "upstream"], registry=self.registry)
        self._accepted_seen: dict[tuple[str, str], float] = {}
        self._ready: dict[tuple[str, str], bool] = {}

    def observe_speculation(self, key: tuple[str, str], rate: float | None, accepted_total: float | None) -> None:
        """The guard's reading; the engines' running total feeds a counter that only grows (a pod restart
        resets theirs: what it counted since is added, as Prometheus' increase() reads a reset)."""
        if rate is not None:
            self.spec_acceptance.labels(*key).set(rate)
        if accepted_total is None:
            return
        last = self._accepted_seen.get(key)
        delta = accepted_total if last is None or accepted_total < last else accepted_total - last
        self._accepted_seen[key] = accepted_total
        self.spec_accepted.labels(*key).inc(max(0.0, delta))

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
