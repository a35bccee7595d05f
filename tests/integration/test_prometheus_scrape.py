"""A real Prometheus server scrapes `oculis serve`'s metrics port and can query what it counted."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import yaml
from router_support import Fakes, start_prometheus
from skips import needs_command
from test_router_processes import start_router
from time_scale import Deadline

pytestmark = needs_command("prometheus", "prometheus")


def test_prometheus_scrapes_router_metrics(fakes: Fakes, tmp_path: Path) -> None:
    cfg_path = tmp_path / "oculis-config.yaml"
    cfg_path.write_text(yaml.safe_dump(fakes.config()))
    router, url, mport = start_router(cfg_path, tmp_path / "router.log")
    prom, purl = start_prometheus(tmp_path, {"oculis": [f"127.0.0.1:{mport}"]})
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0)
        for _ in range(3):
            client.chat.completions.create(model="adaptive", messages=[{"role": "user", "content": "hi"}])
        query = 'sum(oculis_requests_total{route="adaptive",outcome="ok"})'
        deadline, value = Deadline(30), None
        while not deadline.expired():
            try:
                r = httpx.get(f"{purl}/api/v1/query", params={"query": query}).json()
                result = r["data"]["result"]
                if result and float(result[0]["value"][1]) >= 3:
                    value = float(result[0]["value"][1])
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        assert value == 3.0
        cost = httpx.get(f"{purl}/api/v1/query",
                         params={"query": "oculis_cost_dollars_total"}).json()["data"]["result"]
        assert cost and cost[0]["metric"]["upstream"] == "llama-8b" and float(cost[0]["value"][1]) > 0
    finally:
        prom.terminate()
        router.terminate()
        prom.wait(10)
        router.wait(10)
