"""The EndpointSlice watch over real HTTP against a small stand-in API server: list, then watch events
(a pod turning Ready, one terminating), with the bearer token; a 410 Gone lists again."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from oculis_router.slices import SliceWatch

NS = "demo"
URL = f"http://llama-vllm.{NS}.svc:8000/v1"


def endpoint(pod: str, ip: str, ready: bool = True, terminating: bool = False) -> dict[str, Any]:
    return {"addresses": [ip], "conditions": {"ready": ready, "serving": ready or terminating,
                                              "terminating": terminating}, "targetRef": {"kind": "Pod", "name": pod}}


def slice_(*eps: dict[str, Any], service: str = "llama-vllm") -> dict[str, Any]:
    return {"metadata": {"name": f"{service}-abc", "labels": {"kubernetes.io/service-name": service}},
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}], "endpoints": list(eps)}


def test_the_watch_follows_ready_and_terminating_pods(tmp_path: Path) -> None:
    events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    lists: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.headers["Authorization"] == "Bearer tok"
        if request.query.get("watch") != "1":
            lists.append(request.query.get("resourceVersion", ""))
            other = slice_(endpoint("x-0", "10.0.0.9"), service="other-vllm")
            return web.json_response({"metadata": {"resourceVersion": "7"},
                                      "items": [slice_(endpoint("pod-a", "10.0.0.1")), other]})
        resp = web.StreamResponse()
        await resp.prepare(request)
        while (ev := await events.get()) is not None:
            await resp.write(json.dumps(ev).encode() + b"\n")
        return resp

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get(f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        token = tmp_path / "token"
        token.write_text("tok\n")
        async with aiohttp.ClientSession() as http:
            watch = SliceWatch(http, f"http://127.0.0.1:{port}", token, None)
            task = asyncio.create_task(watch.run())

            async def ids() -> set[str]:
                for _ in range(200):
                    listed = watch.replicas(URL, "stable")
                    if listed is not None:
                        return {r.id for r in listed}
                    await asyncio.sleep(0.01)
                raise AssertionError("never listed")

            async def until(want: set[str]) -> None:
                for _ in range(200):
                    if await ids() == want:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"listed {await ids()}, want {want}")

            try:
                await until({"pod-a"})
                first = watch.replicas(URL, "stable")
                assert first is not None and first[0].url == "http://10.0.0.1:8000/v1"
                assert first[0].kv_events == "tcp://10.0.0.1:5557"
                await events.put({"type": "MODIFIED", "object": slice_(endpoint("pod-a", "10.0.0.1"),
                                                                       endpoint("pod-b", "10.0.0.2", ready=False))})
                await until({"pod-a"})  # not Ready yet: not a candidate
                await events.put({"type": "MODIFIED", "object": slice_(endpoint("pod-a", "10.0.0.1"),
                                                                       endpoint("pod-b", "10.0.0.2"))})
                await until({"pod-a", "pod-b"})
                await events.put({"type": "MODIFIED", "object": slice_(
                    endpoint("pod-a", "10.0.0.1", ready=False, terminating=True), endpoint("pod-b", "10.0.0.2"))})
                await until({"pod-b"})  # terminating: no new requests
                await events.put({"type": "ERROR", "object": {"code": 410}})  # too old: list again
                await until({"pod-a"})
                assert len(lists) == 2
            finally:
                task.cancel()
                for _ in range(len(lists)):  # one per watch still held open
                    await events.put(None)
                await runner.cleanup()

    asyncio.run(scenario())
