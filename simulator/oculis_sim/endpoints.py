"""vLLM 0.32's other endpoints on the simulator: /v1/models, /health, /ping (GET and POST), /version, /load,
/tokenize, /detokenize, /metrics; and the simulator's own /sim/stats. Thin handlers over the server's state."""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from oculis_sim import FINGERPRINT, VLLM_VERSION
from oculis_sim.api_request import ApiError, json_error, schema_error
from oculis_sim.tokens import TEMPLATE_TOKENS_PER_MESSAGE, decode, prompt_tokens, token_id

if TYPE_CHECKING:
    from oculis_sim.server import SimServer


def _permission(now: int) -> dict[str, Any]:
    return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
            "group": None, "is_blocking": False}


def add_routes(app: web.Application, sim: SimServer) -> None:
    s = sim.settings

    def error(err: ApiError) -> web.Response:
        return web.json_response(err.body(), status=err.status)

    async def models(request: web.Request) -> web.Response:
        now = int(time.time())
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": now, "owned_by": FINGERPRINT, "root": s.model_path,
             "parent": None, "max_model_len": s.max_model_len, "permission": [_permission(now)]}
            for name in s.served_names] + (sim.lora.cards(now, _permission(now)) if sim.lora else [])})

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=503 if sim.dead else 200)

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION})

    async def load(request: web.Request) -> web.Response:
        return web.json_response({"server_load": sim.in_flight})

    async def body_of(request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise json_error(exc) from None
        except UnicodeDecodeError:
            raise json_error(json.JSONDecodeError("invalid UTF-8", "", 0)) from None
        if not isinstance(body, dict):
            raise schema_error("model_attributes_type", (), "Input should be a valid dictionary", body)
        model = body.get("model")
        if model and model not in s.served_names:
            raise ApiError(404, f"The model `{model}` does not exist. Valid aliases: {', '.join(s.served_names)}.",
                           "NotFoundError", "model")
        return body

    async def tokenize(request: web.Request) -> web.Response:
        try:
            body = await body_of(request)
            if isinstance(body.get("messages"), list):
                msgs = body["messages"]
                toks = prompt_tokens([f"{m.get('role', '')} {m.get('content') or ''}" for m in msgs
                                      if isinstance(m, dict)])
                extra = TEMPLATE_TOKENS_PER_MESSAGE * len(msgs)
            elif isinstance(body.get("prompt"), str):
                toks, extra = prompt_tokens([body["prompt"]]), 0
            else:
                raise schema_error("missing", ("prompt",), "Field required", body)
        except ApiError as err:
            return error(err)
        ids = [token_id(t, s.model.vocab_size) for t in toks] + [0] * extra
        strs = [*toks, *[""] * extra] if body.get("return_token_strs") else None
        return web.json_response({"count": len(ids), "max_model_len": s.max_model_len, "tokens": ids,
                                  "token_strs": strs})

    async def detokenize(request: web.Request) -> web.Response:
        try:
            body = await body_of(request)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids):
                raise schema_error("missing" if ids is None else "list_type", ("tokens",),
                                   "Field required" if ids is None else "Input should be a valid list", ids)
        except ApiError as err:
            return error(err)
        return web.json_response({"prompt": decode(ids) if ids else ""})

    async def metrics_view(request: web.Request) -> web.Response:
        sim.metrics.sync(sim.core)
        return web.Response(body=generate_latest(sim.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(request: web.Request) -> web.Response:
        """The simulator's own timing: |send time - modelled step end| of recent tokens."""
        n = min(sim.late_n, len(sim.lateness))
        lat = sim.lateness[:n] * 1000
        p50, p90, p99, p999 = (np.percentile(lat, [50, 90, 99, 99.9]).tolist() if n else [0.0] * 4)
        within = float((lat <= 5.0).mean()) if n else 1.0
        return web.json_response({"simulated": True, "tokens": sim.late_n, "steps": sim.core.counters.steps,
                                  "lateness_ms": {"p50": p50, "p90": p90, "p99": p99, "p99.9": p999,
                                                  "max": sim.late_max * 1000, "share_within_5ms": within}})

    r = app.router
    r.add_get("/v1/models", models)
    r.add_get("/health", health)
    r.add_get("/ping", health)
    r.add_post("/ping", health)
    r.add_get("/version", version)
    r.add_get("/load", load)
    r.add_post("/tokenize", tokenize)
    r.add_post("/detokenize", detokenize)
    r.add_get("/metrics", metrics_view)
    r.add_get("/sim/stats", stats)
