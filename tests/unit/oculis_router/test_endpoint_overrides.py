"""`oculis serve --endpoints FILE`: base_url hosts named in the map are dialled at 127.0.0.1 ports only,
the map is followed as it changes, and a bad map is one line naming the field."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from oculis_router.endpoints import EndpointResolver, EndpointsError, parse_endpoints

HOST = "llama-8b-vllm.demo.svc"


class _NoDNS(AbstractResolver):
    def __init__(self) -> None:
        self.asked: list[str] = []

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        self.asked.append(host)
        raise OSError(f"{host}: no DNS in this test")

    async def close(self) -> None:
        pass


def _write(path: Path, table: dict[str, list[int]], bump: int = 0) -> None:
    path.write_text(json.dumps({h: {"upstream": "llama-8b", "namespace": "demo", "ports": p}
                                for h, p in table.items()}))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump))  # a rewrite within one mtime tick


def test_endpoint_map_yields_only_loopback_ports_spread_and_followed(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    _write(path, {HOST: [41001, 41002]})
    fallback = _NoDNS()
    res = EndpointResolver(path, fallback)

    async def go() -> None:
        first = await res.resolve(HOST, 8000)
        second = await res.resolve(HOST.upper() + ".", 8000)
        assert {r["host"] for r in first + second} == {"127.0.0.1"}
        assert [r["port"] for r in first] == [41001, 41002] and [r["port"] for r in second] == [41002, 41001]
        _write(path, {HOST: [41003]}, bump=1_000_000)  # the rollout replaced both pods
        assert [r["port"] for r in await res.resolve(HOST, 8000)] == [41003]
        _write(path, {HOST: []}, bump=2_000_000)  # scaled to zero: refused, never sent elsewhere
        with pytest.raises(OSError, match="no pod serves it"):
            await res.resolve(HOST, 8000)
        path.write_text("{broken")  # a half-written map keeps the last good one
        with pytest.raises(OSError, match="no pod serves it"):
            await res.resolve(HOST, 8000)
        with pytest.raises(OSError, match="no DNS"):
            await res.resolve("api.openai.com", 443)
        assert fallback.asked == ["api.openai.com"]

    asyncio.run(go())


def test_endpoint_map_reaches_a_local_server_by_its_service_name(tmp_path: Path) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"via": request.host})

    async def go() -> None:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        path = tmp_path / "endpoints.json"
        _write(path, {HOST: [port]})
        conn = aiohttp.TCPConnector(resolver=EndpointResolver(path, _NoDNS()), use_dns_cache=False)
        async with aiohttp.ClientSession(connector=conn) as http, http.get(f"http://{HOST}:8000/v1/models") as resp:
            assert resp.status == 200 and (await resp.json())["via"] == f"{HOST}:8000"
        await runner.cleanup()

    asyncio.run(go())


@pytest.mark.parametrize(("text", "message"), [
    ("[1, 2]", "must be a mapping"),
    ('{"a.svc": [1]}', "'a.svc': each entry must be {ports"),
    ('{"a.svc": {"ports": [0]}}', "a.svc.ports[0]=0 is not a port"),
    ('{"a.svc": {"ports": ["x"]}}', "a.svc.ports[0]='x' is not a port"),
    ("{a: [", "not YAML or JSON"),
])
def test_bad_endpoint_map_is_one_line_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(EndpointsError) as err:
        parse_endpoints(text, "map.json")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_serve_refuses_a_bad_endpoint_map_before_binding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oculis_cli.main import main

    bad = tmp_path / "endpoints.json"
    bad.write_text('{"llama-8b-vllm.demo.svc": {"ports": [70000]}}')
    root = Path(__file__).resolve().parents[3]
    code = main(["serve", "--config", str(root / "examples" / "oculis-config.yaml"), "--endpoints", str(bad),
                 "--port", "0", "--metrics-port", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err
    assert "llama-8b-vllm.demo.svc.ports[0]=70000 is not a port" in err
    assert main(["serve", "--config", str(root / "examples" / "oculis-config.yaml"), "--endpoints",
                 str(tmp_path / "missing.json"), "--port", "0", "--metrics-port", "0"]) == 2
    assert "cannot read it" in capsys.readouterr().err
