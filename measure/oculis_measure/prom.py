"""A thin client over Prometheus's HTTP API (`/api/v1/query`, `/api/v1/query_range`): instant and range
queries and counter deltas over a window, for the measurement commands (`bench run`, `route analyze
--since`, `cost report`, `cache advise`, `status --check-deps`).

Prometheus does the PromQL (rates, increases, sums); this module only sends queries, turns its JSON
answers into floats and says in one line why Prometheus could not be asked (`PromError`), so a command
can exit 5 with that line instead of a traceback. httpx is the HTTP client (the `bench` extra).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx


class PromError(RuntimeError):
    """Prometheus unreachable, or it refused a query; the message is one line naming the URL and the fix."""


@dataclass(frozen=True, slots=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True, slots=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]  # (unix seconds, value)


def _value(raw: Any) -> float:
    # Prometheus encodes sample values as strings ("NaN", "+Inf" included): float() reads them all.
    return float(raw[1])


class Prometheus:
    """Queries one Prometheus server. `url` is its base, e.g. http://127.0.0.1:9090."""

    def __init__(self, url: str, timeout: float = 10.0, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        try:
            resp = self.client.get(f"{self.url}{path}", params=params)
        except httpx.HTTPError as exc:
            raise PromError(f"Prometheus at {self.url} is unreachable ({type(exc).__name__}: {exc}); start it or "
                            "give the right --prometheus-url") from None
        try:
            body = resp.json()
        except ValueError:
            raise PromError(f"{self.url}{path} answered HTTP {resp.status_code} without Prometheus JSON; is "
                            "--prometheus-url a Prometheus server?") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            err = body.get("error") if isinstance(body, dict) else None
            raise PromError(f"Prometheus at {self.url} refused {params.get('query')!r}: {err or resp.status_code}")
        return body["data"]

    def ready(self) -> None:
        """PromError unless the server answers a trivial query."""
        self.query("1")

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """An instant query (at unix time `at`, default now): one Sample per series; a scalar is one
        Sample with no labels."""
        params: dict[str, Any] = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._get("/api/v1/query", params)
        kind, result = data.get("resultType"), data.get("result")
        if kind in ("scalar", "string"):
            return [Sample({}, _value(result))]
        return [Sample(dict(r.get("metric", {})), _value(r["value"])) for r in result or []]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{max(step, 0.001):.3f}"})
        return [Series(dict(r.get("metric", {})), [(float(t), float(v)) for t, v in r.get("values", [])])
                for r in data.get("result") or []]

    def scalar(self, promql: str, at: float | None = None) -> float | None:
        """The sum of an instant query's values, or None when it returned no series (nothing scraped)."""
        samples = [s.value for s in self.query(promql, at) if not math.isnan(s.value)]
        return sum(samples) if samples else None

    def delta(self, counter_expr: str, start: float, end: float) -> float | None:
        """How much `sum(counter_expr)` grew between two instants: its value at `end` minus its value at
        `start` (a series born inside the window started at 0). Exact over the window, unlike
        `increase()`, which extrapolates to the window's edges. None when nothing was scraped at `end`."""
        after = self.scalar(f"sum({counter_expr})", end)
        if after is None:
            return None
        before = self.scalar(f"sum({counter_expr})", start) or 0.0
        # a restart inside the window reset the counter: count what it reached since (as `deltas` does)
        return after - before if after >= before else after

    def deltas(self, selector: str, by: tuple[str, ...], start: float, end: float) -> dict[tuple[str, ...], float]:
        """`delta` per label set: how much a counter (`selector`, a plain series selector such as
        `oculis_requests_total{job="oculis"}`) grew between two instants, summed by the values of `by`
        (the keys, in order). The end value of each series is its last sample inside the window, so a
        process that stopped before `end` (a replaced router pod) still counts; a key born inside the
        window started at 0; a key whose value fell (its process restarted in place) counts what it
        reached since the restart."""
        labels = ", ".join(by)
        seconds = max(math.ceil(end - start), 1)
        before = self._by(f"sum by ({labels}) ({selector})", by, start)
        after = self._by(f"sum by ({labels}) (last_over_time({selector}[{seconds}s]))", by, end)
        return {k: v - before.get(k, 0.0) if v >= before.get(k, 0.0) else v for k, v in after.items()}

    def _by(self, promql: str, by: tuple[str, ...], at: float) -> dict[tuple[str, ...], float]:
        return {tuple(s.labels.get(k, "") for k in by): s.value for s in self.query(promql, at)
                if not math.isnan(s.value)}

    def wait_scraped(self, at: float, timeout: float = 15.0) -> bool:
        """Wait until every active target has been scraped after unix time `at` (so a delta ending at
        `at` is complete); False if that did not happen within `timeout` seconds. It asks the targets
        API rather than `up`: a target not yet scraped once has no `up` series, so `min(up)` would say
        "all scraped" while one job had not started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            scraped = self._last_scrapes()
            if scraped and min(scraped) >= at:
                return True
            time.sleep(0.25)
        return False

    def _last_scrapes(self) -> list[float]:
        """Each active target's last scrape (unix seconds; 0 for one never scraped)."""
        data = self._get("/api/v1/targets", {"state": "active"})
        out: list[float] = []
        for t in data.get("activeTargets") or []:
            try:
                out.append(max(datetime.fromisoformat(str(t.get("lastScrape"))).timestamp(), 0.0))
            except (ValueError, OverflowError):
                out.append(0.0)
        return out
