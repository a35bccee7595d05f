"""`oculis sim serve --enable-lora` loads adapters at runtime as vLLM 0.32 does: the endpoints exist only
with VLLM_ALLOW_RUNTIME_LORA_UPDATING true (vllm/entrypoints/serve/lora/api_router.py), and a lora_path
vLLM cannot read is its 404 LoRAAdapterNotFoundError (vllm/exceptions.py)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from oculis_sim.lora import add_routes, from_args

ARGS = ["--enable-lora", "--max-loras", "2"]


async def client_for(env: dict[str, str]) -> TestClient:  # type: ignore[type-arg]
    adapters, rest = from_args(ARGS, "qwen", env)
    assert adapters is not None and rest == []
    app = web.Application()
    add_routes(app, adapters)
    client: TestClient = TestClient(TestServer(app))  # type: ignore[type-arg]
    await client.start_server()
    return client


async def test_without_the_env_the_endpoints_are_not_there() -> None:
    for env in ({}, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "False"}, {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "yes"}):
        client = await client_for(env)
        try:
            for verb in ("load", "unload"):
                r = await client.post(f"/v1/{verb}_lora_adapter", json={"lora_name": "a", "lora_path": "/a"})
                assert r.status == 404 and await r.json() == {"detail": "Not Found"}
        finally:
            await client.close()


async def test_a_path_without_an_adapter_is_vllms_not_found_and_a_real_folder_loads(tmp_path: Path) -> None:
    (tmp_path / "sql").mkdir()
    (tmp_path / "sql" / "adapter_config.json").write_text('{"r": 8}')
    client = await client_for({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        missing = await client.post("/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": "/nope/bad"})
        assert missing.status == 404
        assert (await missing.json())["error"] == {"message": "Loading lora bad failed: No adapter found for /nope/bad",
                                                   "type": "NotFoundError", "param": None, "code": 404}
        empty = await client.post("/v1/load_lora_adapter", json={"lora_name": "e", "lora_path": str(tmp_path)})
        assert empty.status == 404  # a folder without adapter_config.json: vLLM finds no adapter either
        ok = await client.post("/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(tmp_path / "sql")})
        assert ok.status == 200 and await ok.text() == "Success: LoRA adapter 'sql' added successfully."
        hub = await client.post("/v1/load_lora_adapter", json={"lora_name": "hub", "lora_path": "org/hub-lora"})
        assert hub.status == 200  # a Hugging Face id: taken as fetched (the simulator downloads nothing)
    finally:
        await client.close()


async def test_offline_a_hugging_face_id_is_not_found() -> None:
    client = await client_for({"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1", "HF_HUB_OFFLINE": "1"})
    try:
        r = await client.post("/v1/load_lora_adapter", json={"lora_name": "hub", "lora_path": "org/hub-lora"})
        assert r.status == 404 and "No adapter found for org/hub-lora" in (await r.json())["error"]["message"]
    finally:
        await client.close()
