"""An engine that dropped an adapter since the router read its list: vLLM's 404 there strikes the adapter
from that replica and the call goes to one that lists it, or, with none left, is the 503 adapter_not_loaded
(two stand-in replicas over loopback HTTP, the router's real Caller)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from oculis import RouterConfig
from oculis_router.adapters import with_adapter
from oculis_router.metrics import Metrics
from oculis_router.pick import Fleet, Replica
from oculis_router.upstreams import Caller
from oculis_router.verdicts import AdapterUnavailable

ANSWER = {"id": "x", "object": "chat.completion", "model": "sql", "usage": {"prompt_tokens": 3, "completion_tokens": 1},
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


def engine(has_sql: bool, seen: list[str]) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["model"])
        if not has_sql:  # vLLM 0.32's words for a model it does not serve
            return web.json_response({"error": {"message": "The model `sql` does not exist. Valid aliases: qwen.",
                                                "type": "NotFoundError", "code": 404}}, status=404)
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def call(lists: dict[str, bool]) -> tuple[Any, Fleet, dict[str, list[str]]]:
    seen: dict[str, list[str]] = {name: [] for name in lists}
    servers = {name: TestServer(engine(has, seen[name])) for name, has in lists.items()}
    for s in servers.values():
        await s.start_server()
    try:
        urls = {name: str(s.make_url("/v1")) for name, s in servers.items()}
        cfg = RouterConfig.model_validate({"upstreams": [{"name": "qwen", "provider": "vllm", "model": "qwen",
                                                          "adapters": ["sql"], "endpoints": list(urls.values())}],
                                           "routes": []})
        fleet = Fleet(Metrics())
        # every replica's list (read earlier) says sql; round-robin tries them in id order
        fleet.sync({"qwen": ("round-robin", [Replica(n, u, adapters=frozenset({"sql"})) for n, u in urls.items()])})
        async with aiohttp.ClientSession() as http:
            caller = Caller(http, backoff=0.0, fleet=fleet)
            up = with_adapter(cfg.upstream("qwen"), "sql")
            body = {"model": "sql", "messages": [{"role": "user", "content": "hi"}]}
            try:
                result: Any = await caller.complete(up, "chat", body)
            except AdapterUnavailable as exc:
                result = exc
        return result, fleet, seen
    finally:
        for s in servers.values():
            await s.close()


def test_a_stale_list_costs_a_retry_on_a_replica_that_has_the_adapter() -> None:
    result, fleet, seen = asyncio.run(call({"a": False, "b": True}))
    assert result["choices"][0]["message"]["content"] == "ok"
    assert seen == {"a": ["sql"], "b": ["sql"]}  # a answered 404 once, b served it
    reps = fleet.pools["qwen"].replicas
    assert reps["a"].adapters == frozenset() and reps["b"].adapters == frozenset({"sql"})
    assert not reps["a"].in_flight_adapters and not reps["b"].in_flight_adapters


def test_with_no_replica_left_the_client_is_told_the_adapter_is_not_loaded() -> None:
    result, _, seen = asyncio.run(call({"a": False}))
    assert isinstance(result, AdapterUnavailable)
    err = result.client_error("qwen")
    assert err.status == 503 and err.code == "adapter_not_loaded" and "'sql'" in err.message
    assert seen == {"a": ["sql"]}  # tried once; then no replica lists it



def test_the_adapter_list_is_read_with_the_upstreams_key() -> None:
    import os

    from oculis_router.replicas import read_adapters

    async def models(request: web.Request) -> web.Response:  # an engine run with --api-key guards /v1/models
        if request.headers.get("Authorization") != "Bearer sk-engine":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return web.json_response({"data": [{"id": "qwen", "parent": None}, {"id": "sql", "parent": "qwen"}]})

    async def run() -> tuple[frozenset[str] | None, frozenset[str] | None]:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        server = TestServer(app)
        await server.start_server()
        try:
            keyless = Replica("a", str(server.make_url("/v1")), serves_adapters=True)
            keyed = Replica("b", str(server.make_url("/v1")), serves_adapters=True,
                            api_key_env="OCULIS_TEST_ENGINE_KEY")
            async with aiohttp.ClientSession() as http:
                await read_adapters(http, keyless, 1.0)
                await read_adapters(http, keyed, 1.0)
            return keyless.adapters, keyed.adapters
        finally:
            await server.close()

    os.environ["OCULIS_TEST_ENGINE_KEY"] = "sk-engine"
    try:
        keyless, keyed = asyncio.run(run())
    finally:
        del os.environ["OCULIS_TEST_ENGINE_KEY"]
    assert keyless is None  # refused: not read, so not taken as "serves no adapter"
    assert keyed == frozenset({"sql"})
