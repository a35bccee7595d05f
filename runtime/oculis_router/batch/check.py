"""A batch input file, checked (pure): JSONL, one request a line as OpenAI's Batch API takes it
(`{"custom_id", "method": "POST", "url", "body"}`), within the line and byte bounds. Every refusal
names the line (1-based), the field and the fix."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from oculis_router import strictjson

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
COMPLETION_WINDOWS = ("24h",)
CUSTOM_ID_MAX = 512
FILE_ID = re.compile(r"^file-[0-9a-f]{24}$")
BATCH_ID = re.compile(r"^batch_[0-9a-f]{24}$")


class InputError(ValueError):
    """What is wrong with a batch input, and where."""

    def __init__(self, message: str, line: int | None = None, param: str | None = None,
                 code: str = "invalid_batch_input") -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line, self.param, self.code = line, param, code


@dataclass(frozen=True)
class Line:
    n: int  # 1-based line number in the input file
    custom_id: str
    url: str
    body: dict[str, Any]

    @property
    def endpoint(self) -> str:
        return ENDPOINTS[self.url]


def parse_input(data: bytes, max_lines: int, max_bytes: int, field: str = "file") -> list[Line]:
    """The requests of a batch input file; InputError for the first thing wrong."""
    if len(data) > max_bytes:
        raise InputError(f"the file has {len(data)} bytes, more than the limit of {max_bytes} "
                         "(server.batch.max_file_bytes); split it into several batches", param=field,
                         code="file_too_large")
    lines: list[Line] = []
    seen: set[str] = set()
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(lines) >= max_lines:
            raise InputError(f"the file has more than {max_lines} requests (server.batch.max_requests_per_batch); "
                             "split it into several batches", line=n, param=field, code="too_many_requests")
        try:
            doc = strictjson.loads(raw, f"line {n}")
        except ValueError as exc:
            raise InputError(f"not a JSON object: {exc}; a batch input file is JSONL, one request a line",
                             line=n, param=field, code="invalid_json_line") from None
        lines.append(_line(doc, n, seen))
    if not lines:
        raise InputError("the file holds no request: a batch input file is JSONL, one "
                         '{"custom_id", "method": "POST", "url", "body"} a line', param=field, code="empty_file")
    return lines


def _line(doc: Any, n: int, seen: set[str]) -> Line:
    if not isinstance(doc, dict):
        raise InputError("not a JSON object; each line is one request object", line=n)
    cid = doc.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > CUSTOM_ID_MAX:
        raise InputError(f"custom_id must be a non-empty string of at most {CUSTOM_ID_MAX} characters",
                         line=n, param="custom_id")
    if cid in seen:
        raise InputError(f"custom_id {cid!r} is used twice; each request needs its own", line=n, param="custom_id")
    seen.add(cid)
    if doc.get("method") != "POST":
        raise InputError(f"method must be \"POST\" (got {doc.get('method')!r})", line=n, param="method")
    url = doc.get("url")
    if url not in ENDPOINTS:
        raise InputError(f"url {url!r} is not served in batches here; use one of {', '.join(ENDPOINTS)}",
                         line=n, param="url")
    body = doc.get("body")
    if not isinstance(body, dict):
        raise InputError("body must be a JSON object: the request as it would be POSTed to url", line=n, param="body")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InputError("body.model is required: a route or upstream name (GET /v1/models)", line=n,
                         param="body.model")
    if body.get("stream"):
        raise InputError("body.stream must be false or absent: batch answers are written whole", line=n,
                         param="body.stream")
    return Line(n, cid, url, body)


def check_for_batch(lines: list[Line], endpoint: str, models: Collection[str]) -> None:
    """Every line posts to the batch's endpoint and names a model this router serves."""
    for line in lines:
        if line.url != endpoint:
            raise InputError(f"url {line.url!r} differs from the batch's endpoint {endpoint!r}; one batch, one "
                             "endpoint", line=line.n, param="url")
        if line.body["model"] not in models:
            shown = ", ".join(sorted(models)[:20])
            raise InputError(f"body.model {line.body['model']!r} is not a route or upstream of this router "
                             f"(known: {shown})", line=line.n, param="body.model", code="model_not_found")
