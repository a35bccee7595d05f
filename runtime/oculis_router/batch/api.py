"""The OpenAI Batch API's HTTP front: /v1/files (upload, list, retrieve, content, delete) and
/v1/batches (create, list, retrieve, cancel), as the openai SDK calls them. Every object belongs to the
tenant that made it (the API key, subdivided by X-Oculis-Tenant: `inbound.tenant_of`); another tenant's
id is a 404, as if it did not exist. Off (404 naming the setting) unless `server.batch.enabled`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HTTPRoute

from oculis import BatchSettings
from oculis_router.batch.check import COMPLETION_WINDOWS, ENDPOINTS, InputError, check_for_batch, parse_input
from oculis_router.batch.redis_store import RedisStore
from oculis_router.batch.runner import FINAL, AnyStore, Runner
from oculis_router.batch.store import OWNER, Store, new_id
from oculis_router.errors import APIError, bad_request
from oculis_router.inbound import read_body, tenant_of
from oculis_router.limits import identity_of

log = logging.getLogger("oculis.router")
WINDOW_S = {"24h": 24 * 3600}
MAX_METADATA = 16
Handler = Callable[[Request], Awaitable[Response]]


def unavailable_errors() -> tuple[type[Exception], ...]:
    """What a store that cannot be used raises: a directory's OSError, Redis's RedisError."""
    import redis

    return (OSError, redis.RedisError)


def no_file(file_id: str, param: str = "id") -> APIError:
    """OpenAI's 404 for a file this tenant cannot see (missing, deleted, or another tenant's: the same answer)."""
    return APIError(404, f"No such File object: {file_id}", param=param, code="file_not_found")

class Stores:
    """The store in force: Redis at server.redis_url when one is set (shared by replicas), else the
    directory (one replica). One Redis client per URL, kept across config reloads."""

    def __init__(self, directory: Callable[[], str], redis_url: Callable[[], str | None]) -> None:
        self.directory, self.redis_url = directory, redis_url
        self.redis: RedisStore | None = None

    def __call__(self) -> AnyStore:
        url = self.redis_url()
        if url is None:
            return Store(Path(self.directory()))
        if self.redis is None or self.redis.url != url:
            self.redis = RedisStore(url)
        return self.redis


class BatchAPI:
    def __init__(self, settings: Callable[[], BatchSettings], check_key: Callable[[Request], None],
                 models: Callable[[], list[str]], runner: Runner, stores: Stores) -> None:
        self.settings, self.check_key, self.models, self.runner = settings, check_key, models, runner
        self.store = stores

    def guarded(self, fn: Callable[[Request, AnyStore, str], Awaitable[Response]]) -> Handler:
        async def handler(request: Request) -> Response:
            try:
                self.check_key(request)
                if not self.settings().enabled:
                    raise APIError(404, f"{request.method} {request.url.path}: the Batch API is off on this router; "
                                   "turn it on with server.batch.enabled: true", code="not_found")
                return await fn(request, self.store(), tenant_of(request))
            except APIError as err:
                return err.response()
            except InputError as err:
                return APIError(400, str(err), param=err.param, code=err.code).response()
            except unavailable_errors() as exc:  # the store cannot be read or written: loud, nothing half-made
                where = self.store().where
                why = (exc.strerror if isinstance(exc, OSError) else None) or exc
                log.error("batch store %s: %s", where, why)
                return APIError(503, f"the batch store ({where}) cannot be used: "
                                f"{why}; interactive requests are unaffected, retry once it is fixed",
                                type_="service_unavailable", code="batch_store_unavailable",
                                headers={"retry-after": "30"}).response()
        return handler

    # ---- files --------------------------------------------------------------------------------------
    async def upload(self, request: Request, store: AnyStore, tenant: str) -> Response:
        cfg = self.settings()
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > cfg.max_file_bytes + 64 * 1024:
            raise APIError(413, f"upload of {declared} bytes exceeds server.batch.max_file_bytes "
                           f"({cfg.max_file_bytes}); split the input into several batches", param="file",
                           code="file_too_large")
        try:
            form = await request.form(max_files=1, max_fields=8)
        except Exception as exc:  # not multipart, or a malformed one: the parser says why
            raise bad_request(f"POST /v1/files takes multipart/form-data with `file` and `purpose` ({exc})",
                              param="file") from None
        purpose, up = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise bad_request(f"purpose {purpose!r} is not served here: only \"batch\" files are taken",
                              param="purpose")
        if not isinstance(up, UploadFile):
            raise bad_request("`file` is required: the JSONL batch input, as a file part", param="file")
        data = await up.read(cfg.max_file_bytes + 1)
        parse_input(data, cfg.max_requests_per_batch, cfg.max_file_bytes)  # the earliest point to refuse it
        meta = await asyncio.to_thread(store.put_file, tenant, up.filename or "input.jsonl", purpose, data)
        return JSONResponse(meta)

    async def list_files(self, request: Request, store: AnyStore, tenant: str) -> Response:
        found = await asyncio.to_thread(store.files, tenant)
        if (p := request.query_params.get("purpose")) is not None:
            found = [f for f in found if f["purpose"] == p]
        return JSONResponse({"object": "list", "data": found, "has_more": False})

    async def file_or_404(self, store: AnyStore, tenant: str, file_id: str) -> dict[str, Any]:
        meta = await asyncio.to_thread(store.file, tenant, file_id)
        if meta is None:
            raise no_file(file_id)
        return meta

    async def get_file(self, request: Request, store: AnyStore, tenant: str) -> Response:
        return JSONResponse(await self.file_or_404(store, tenant, request.path_params["file_id"]))

    async def content(self, request: Request, store: AnyStore, tenant: str) -> Response:
        file_id = request.path_params["file_id"]
        await self.file_or_404(store, tenant, file_id)
        data = await asyncio.to_thread(store.file_bytes, tenant, file_id)
        if data is None:
            raise no_file(file_id)
        return Response(data, media_type="application/jsonl")

    async def delete_file(self, request: Request, store: AnyStore, tenant: str) -> Response:
        file_id = request.path_params["file_id"]
        await self.file_or_404(store, tenant, file_id)
        await asyncio.to_thread(store.delete_file, tenant, file_id)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    # ---- batches ------------------------------------------------------------------------------------
    async def create(self, request: Request, store: AnyStore, tenant: str) -> Response:
        cfg = self.settings()
        body = await read_body(request, 64 * 1024)
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        window, metadata = body.get("completion_window"), body.get("metadata")
        if not isinstance(file_id, str):
            raise bad_request("input_file_id is required: the id of an uploaded purpose=batch file",
                              param="input_file_id")
        if endpoint not in ENDPOINTS:
            raise bad_request(f"endpoint {endpoint!r} is not served in batches here; use one of "
                              f"{', '.join(ENDPOINTS)}", param="endpoint")
        if window not in COMPLETION_WINDOWS:
            raise bad_request(f"completion_window {window!r} is not supported; use {', '.join(COMPLETION_WINDOWS)}",
                              param="completion_window")
        if metadata is not None and (not isinstance(metadata, dict) or len(metadata) > MAX_METADATA or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
            raise bad_request(f"metadata must be an object of at most {MAX_METADATA} string values",
                              param="metadata")
        await asyncio.to_thread(store.check)  # Redis down: a loud 503 naming it, before anything is made
        meta = await asyncio.to_thread(store.file, tenant, file_id)
        data = await asyncio.to_thread(store.file_bytes, tenant, file_id)
        if meta is None or data is None:  # another tenant's file is not there, as far as this one can tell
            raise no_file(file_id, "input_file_id")
        if meta["purpose"] != "batch":
            raise bad_request(f"file {file_id} has purpose {meta['purpose']!r}; a batch's input needs purpose "
                              "\"batch\"", param="input_file_id")
        lines = parse_input(data, cfg.max_requests_per_batch, cfg.max_file_bytes, "input_file_id")
        check_for_batch(lines, endpoint, set(self.models()))
        now = int(time.time())
        who = identity_of(request.headers, tenant)
        batch: dict[str, Any] = {
            "id": new_id("batch_"), "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": file_id, "completion_window": window, "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
            "expires_at": now + WINDOW_S[window], "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0}, "metadata": metadata,
            OWNER: {"tenant": tenant, "key_sha256": who.key_sha256, "tenant_header": who.tenant_header}}
        # the batch keeps its own copy of the input: deleting the file later does not stop it
        await asyncio.to_thread(store.put_input, tenant, batch["id"], data)  # first: a replica may resume it
        await asyncio.to_thread(store.save_batch, tenant, batch)
        self.runner.start(store, batch, cfg.concurrency)
        return JSONResponse(public(batch))

    async def batch_or_404(self, store: AnyStore, tenant: str, batch_id: str) -> dict[str, Any]:
        b = await asyncio.to_thread(store.batch, tenant, batch_id)
        if b is None:
            raise APIError(404, f"No such Batch object: {batch_id}", param="id", code="batch_not_found")
        return b

    async def get_batch(self, request: Request, store: AnyStore, tenant: str) -> Response:
        return JSONResponse(public(await self.batch_or_404(store, tenant, request.path_params["batch_id"])))

    async def list_batches(self, request: Request, store: AnyStore, tenant: str) -> Response:
        found = await asyncio.to_thread(store.batches, tenant)
        after = request.query_params.get("after")
        if after is not None:
            ids = [b["id"] for b in found]
            found = found[ids.index(after) + 1:] if after in ids else []
        raw = request.query_params.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            raise bad_request(f"limit {raw!r} must be a whole number from 1 to 100", param="limit")
        page = found[:int(raw)]
        return JSONResponse({"object": "list", "data": [public(b) for b in page],
                             "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None,
                             "has_more": len(found) > len(page)})

    async def cancel(self, request: Request, store: AnyStore, tenant: str) -> Response:
        batch_id = request.path_params["batch_id"]
        b = await self.batch_or_404(store, tenant, batch_id)
        if b["status"] in FINAL or b["status"] == "cancelling":
            if b["status"] != "cancelling" and b["status"] != "cancelled":
                raise APIError(409, f"batch {batch_id} is {b['status']}: it can no longer be cancelled",
                               param="batch_id", code="batch_not_cancellable")
            return JSONResponse(public(b))
        run = self.runner.runs.get(batch_id)
        target = run.batch if run is not None else b
        target.update(status="cancelling", cancelling_at=int(time.time()))
        await asyncio.to_thread(store.save_batch, tenant, dict(target))
        self.runner.cancel(batch_id)  # a batch another replica runs sees it in the store
        return JSONResponse(public(target))

    def routes(self) -> list[HTTPRoute]:
        g = self.guarded
        return [
            HTTPRoute("/v1/files", g(self.upload), methods=["POST"]),
            HTTPRoute("/v1/files", g(self.list_files), methods=["GET"]),
            HTTPRoute("/v1/files/{file_id}", g(self.get_file), methods=["GET"]),
            HTTPRoute("/v1/files/{file_id}", g(self.delete_file), methods=["DELETE"]),
            HTTPRoute("/v1/files/{file_id}/content", g(self.content), methods=["GET"]),
            HTTPRoute("/v1/batches", g(self.create), methods=["POST"]),
            HTTPRoute("/v1/batches", g(self.list_batches), methods=["GET"]),
            HTTPRoute("/v1/batches/{batch_id}", g(self.get_batch), methods=["GET"]),
            HTTPRoute("/v1/batches/{batch_id}/cancel", g(self.cancel), methods=["POST"]),
        ]


def public(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in batch.items() if k != OWNER}
