"""The Prometheus client: what it asks (instant queries at the window's edges) and how it reads the
answers, over httpx's mock transport; a server that is down or answers something else is one line."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from oculis_measure.prom import PromError, Prometheus


def prom_with(values: dict[tuple[str, str | None], list[dict[str, Any]]]) -> tuple[Prometheus, list[dict[str, str]]]:
    seen: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        params = dict(request.url.params)
        seen.append(params)
        result = values.get((params["query"], params.get("time")), [])
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})

    return Prometheus("http://prom:9090/", client=httpx.Client(transport=httpx.MockTransport(handler))), seen


def vec(*values: float) -> list[dict[str, Any]]:
    return [{"metric": {"instance": str(i)}, "value": [0, str(v)]} for i, v in enumerate(values)]


def test_delta_is_the_summed_counter_at_the_end_minus_at_the_start() -> None:
    q = "sum(vllm:num_preemptions_total)"
    prom, seen = prom_with({(q, "100.000"): vec(3.0), (q, "160.000"): vec(10.0)})
    assert prom.delta("vllm:num_preemptions_total", 100.0, 160.0) == 7.0
    assert [s["time"] for s in seen] == ["160.000", "100.000"] and seen[0]["query"] == q


def test_a_series_born_in_the_window_starts_at_zero_and_one_never_scraped_is_none() -> None:
    q = "sum(x_total)"
    prom, _ = prom_with({(q, "2.000"): vec(5.0)})
    assert prom.delta("x_total", 1.0, 2.0) == 5.0
    assert prom.delta("y_total", 1.0, 2.0) is None


def test_a_counter_reset_inside_the_window_counts_what_it_reached_since() -> None:
    q = "sum(x_total)"
    prom, _ = prom_with({(q, "1.000"): vec(50.0), (q, "2.000"): vec(4.0)})
    assert prom.delta("x_total", 1.0, 2.0) == 4.0


def test_scalar_sums_series_and_skips_nan() -> None:
    prom, _ = prom_with({("q", None): [*vec(1.5, 2.5), {"metric": {}, "value": [0, "NaN"]}]})
    assert prom.scalar("q") == 4.0


def test_unreachable_or_not_prometheus_is_one_line_naming_the_url() -> None:
    with pytest.raises(PromError, match=r"Prometheus at http://127.0.0.1:9 is unreachable .*--prometheus-url"):
        Prometheus("http://127.0.0.1:9", timeout=2).ready()

    def html(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>grafana</html>")

    prom = Prometheus("http://x", client=httpx.Client(transport=httpx.MockTransport(html)))
    with pytest.raises(PromError, match=r"answered HTTP 200 without Prometheus JSON"):
        prom.ready()

    def refused(_: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"})

    prom = Prometheus("http://x", client=httpx.Client(transport=httpx.MockTransport(refused)))
    with pytest.raises(PromError, match=r"refused 'sum\(\(\)': parse error"):
        prom.query("sum(()")
