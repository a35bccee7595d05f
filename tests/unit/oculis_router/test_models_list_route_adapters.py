"""`model: <route>/<adapter>` is served (README), but `GET /v1/models/sqlroute/sql` was a 404 ("does not
exist") and `GET /v1/models` did not list it, while the same model answered a POST (QA pass 3): a client
that checks the model first (the SDKs' models.retrieve) was told it does not exist. Both now list it,
beside `<upstream>/<adapter>`."""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

from oculis_router.app import build_app
from oculis_router.metrics import Metrics
from oculis_router.state import ConfigHolder, describe

CONFIG = """oculis:
  upstreams:
    - {name: llama, provider: vllm, model: m, base_url: "http://127.0.0.1:9/v1", adapters: [sql, ext]}
    - {name: big, provider: vllm, model: m, base_url: "http://127.0.0.1:9/v1"}
  routes:
    - name: sqlroute
      tiers: [{name: cheap, upstream: llama, adapter: sql}, {name: strong, upstream: big}]
    - name: plain
      tiers: [{name: only, upstream: big}]
"""


def test_route_adapters_are_listed_and_retrievable(tmp_path: Path) -> None:
    path = tmp_path / "oculis-config.yaml"
    path.write_text(CONFIG)
    adapters = {m["id"]: m["parent"] for m in describe(ConfigHolder(path, Metrics()).current)
                if m["kind"] == "adapter"}
    assert adapters == {"llama/sql": "llama", "llama/ext": "llama", "sqlroute/sql": "sqlroute",
                        "sqlroute/ext": "sqlroute"}  # plain's only upstream has none
    with TestClient(build_app(config_path=path)) as client:
        got = client.get("/v1/models/sqlroute/sql")
        assert got.status_code == 200 and got.json()["parent"] == "sqlroute", got.text
        assert client.get("/v1/models/plain/sql").status_code == 404
