"""The router's API as an OpenAPI 3.1 document (`GET /openapi.json`), kept in this one place.

The shapes are pydantic models, so the document is generated, not hand-written JSON: the request
bodies as far as the router itself checks them (inbound.check_body; other fields pass through to the
engine, so `additionalProperties` stays open), the answers as far as the router guarantees them (an
upstream's answer is relayed, so only the fields every OpenAI-compatible answer has are required), and
the one error shape every refusal uses (errors.APIError). Fuzzers (schemathesis in the test suite)
and client generators read it; the statuses listed per operation are every status the router can
answer with, so an answer outside them is a defect, not an undocumented case.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from oculis.router import ServerSettings
from oculis_router.inbound import MAX_CHOICES

_DEFAULTS = ServerSettings()
_N = "choices, passed through (1 on a route that checks answers)"


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """Every refusal of the router, and every upstream error it relays, has this shape."""

    error: ErrorDetail


class ChatMessage(_Open):
    role: str
    content: Any = None


class ChatRequest(_Open):
    model: str = Field(min_length=1, description="a route or upstream name (GET /v1/models)")
    messages: list[ChatMessage] = Field(min_length=1, max_length=_DEFAULTS.max_messages)
    stream: bool | None = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES, description=_N)


class CompletionRequest(_Open):
    model: str = Field(min_length=1, description="a route or upstream name (GET /v1/models)")
    prompt: str | list[str]
    stream: bool | None = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES, description=_N)


class Choice(_Open):
    index: int


class ChatCompletion(_Open):
    id: str
    object: Literal["chat.completion"]
    choices: list[Choice]


class Completion(_Open):
    id: str
    object: Literal["text_completion"]
    choices: list[Choice]


class ModelObject(_Open):
    id: str
    object: Literal["model"]
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelObject]


class Status(_Open):
    status: str


_MODELS = (ErrorBody, ErrorDetail, ChatMessage, ChatRequest, CompletionRequest, Choice, ChatCompletion, Completion,
           ModelObject, ModelList, Status)


def _components() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    for m in _MODELS:
        schema = m.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[m.__name__] = schema
    return schemas


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": _json("ErrorBody")}


# Statuses the router answers for a generation request, and why; an upstream's own 4xx is relayed
# as it came (its status, its OpenAI-shaped body), hence the whole 4XX range.
_GENERATION_ERRORS = {
    "4XX": _error("the request was refused (bad input, unknown model, over a limit) or an upstream's own "
                  "refusal relayed"),
    "400": _error("invalid JSON or a parameter the router cannot take; `error.param` names it"),
    "401": _error("server.client_keys_env is set and the bearer key is not one of its keys"),
    "404": _error("no route or upstream of that name"),
    "413": _error("the body is larger than server.max_body_bytes"),
    "429": _error("a rate limit or budget (Retry-After says when it fits)"),
    "431": _error("the request headers are larger than server.max_header_bytes"),
    "500": _error("an internal router error (logged by the router)"),
    "502": _error("every tier failed (`error.code` says how the last one failed)"),
    "503": _error("no config loaded yet, no tier can be reached, or no replica has the LoRA adapter asked for loaded "
                  "yet (code adapter_not_loaded, with Retry-After)"),
    "504": _error("every tier timed out"),
}
_ANY_ERRORS = {k: v for k, v in _GENERATION_ERRORS.items() if k in ("401", "404", "405", "431", "500")}
_ANY_ERRORS["405"] = _error("the method is not served on this path")


# One server-sent event (a stream is judged event by event): `data` is a chunk object as JSON, the
# final `[DONE]`, or an error object {"error": {...}} when the stream could not be finished.
_SSE_EVENT = {"type": "object", "required": ["data"], "properties": {
    "data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}, "retry": {"type": "integer"}}}


def _generation(summary: str, request: str, answer: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": _json(request)},
            "responses": {
                "200": {
                    "description": "the answer; with `stream: true`, server-sent events ending in `data: [DONE]` "
                                   "or in an error event",
                    "content": {**_json(answer), "text/event-stream": {"schema": _SSE_EVENT}},
                },
                **_GENERATION_ERRORS,
                "405": _ANY_ERRORS["405"],
            },
        }
    }


def document(model_names: list[str] | None = None) -> dict[str, Any]:
    """The OpenAPI document; `model_names` (the routes and upstreams now served) are offered as the
    known values of `model` (any other string is still a valid request: it gets a 404)."""
    components = _components()
    if model_names:
        for req in ("ChatRequest", "CompletionRequest"):
            prop = components[req]["properties"]["model"]
            prop["examples"] = model_names[:50]
    return {
        "openapi": "3.1.0",
        "info": {"title": "Oculis router", "version": "1",
                 "description": "OpenAI-compatible: POST /v1/chat/completions and /v1/completions, GET /v1/models"},
        "paths": {
            "/v1/chat/completions": _generation("a chat completion, routed by the prompt's complexity", "ChatRequest",
                                                "ChatCompletion"),
            "/v1/completions": _generation("a text completion, routed by the prompt's complexity",
                                           "CompletionRequest", "Completion"),
            "/v1/models": {"get": {"summary": "the routes, then the upstreams", "responses": {
                "200": {"description": "the models", "content": _json("ModelList")}, **_ANY_ERRORS}}},
            "/v1/models/{model_id}": {"get": {
                "summary": "one model (the SDKs' models.retrieve)",
                "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "the model", "content": _json("ModelObject")}, **_ANY_ERRORS}}},
            "/healthz": {"get": {"summary": "the process is up", "responses": {
                "200": {"description": "up", "content": _json("Status")}, **_ANY_ERRORS}}},
            "/readyz": {"get": {"summary": "a config is loaded and its watcher runs", "responses": {
                "200": {"description": "ready", "content": _json("Status")},
                "503": {"description": "not ready: waiting for the config, or its watcher stopped",
                        "content": _json("Status")}, **_ANY_ERRORS}}},
            "/openapi.json": {"get": {"summary": "this document", "responses": {
                "200": {"description": "OpenAPI 3.1", "content": {"application/json": {"schema": {"type": "object"}}}},
                **_ANY_ERRORS}}},
        },
        "components": {"schemas": components},
    }
