"""The router fuzzed against its own OpenAPI document (GET /openapi.json) by schemathesis: a real
`oculis serve` process over the fake upstreams, a bounded number of examples per operation, and
every answer must be no 5xx, within its time and inside the documented statuses, content types and
schemas. Also the input limits a fuzzer cannot reach by chance: a 64 MiB body, huge headers,
thousands of messages, deep JSON, each a clean 4xx the client (httpx, the openai SDK) can read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from router_support import Fakes, start_router
from schemathesis import GenerationMode, checks

RouterProc = tuple[str, Path]


@pytest.fixture(scope="module")
def served(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProc]:
    tmp = tmp_path_factory.mktemp("fuzz")
    cfg = fakes.config()
    path = tmp / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc, url, _ = start_router(path, tmp / "router.log")
    yield url, tmp / "router.log"
    proc.terminate()
    proc.wait(15)
    log = (tmp / "router.log").read_text()
    assert "Traceback" not in log, log[-3000:]


OPERATIONS = [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/models", "GET"),
              ("/v1/models/{model_id}", "GET"), ("/healthz", "GET"), ("/readyz", "GET"), ("/openapi.json", "GET")]
FUZZ_CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
               checks.response_schema_conformance, checks.response_headers_conformance]


# Invalid input only where there is input to get wrong (a GET without parameters has none).
CASES = [(p, m, GenerationMode.POSITIVE) for p, m in OPERATIONS] + [
    (p, m, GenerationMode.NEGATIVE) for p, m in OPERATIONS if m == "POST"]


@pytest.mark.parametrize(("path", "method", "mode"), CASES, ids=[f"{m} {p} {g.value}" for p, m, g in CASES])
def test_router_answers_every_generated_request_inside_its_schema(served: RouterProc, path: str, method: str,
                                                                  mode: GenerationMode) -> None:
    # Driven through hypothesis directly: schemathesis' pytest plugin does not load under pytest 9.
    operation = schemathesis.openapi.from_url(served[0] + "/openapi.json")[path][method]

    known = httpx.get(served[0] + "/v1/models").json()["data"]

    @given(case=operation.as_strategy(mode), model=st.sampled_from([m["id"] for m in known] + [None]))
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def fuzz(case: Any, model: str | None) -> None:
        # A random `model` is a 404 before anything else is looked at: most cases name a served one,
        # so the classifier, cache, limits and upstream calls see the generated rest of the body.
        if model and isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
            case.body["model"] = model
        # 20 s is far past any answer of the fakes: a request still open then is a hang.
        case.call_and_validate(base_url=served[0], checks=FUZZ_CHECKS, timeout=20)

    fuzz()


def test_openapi_document_covers_every_endpoint_and_error_shape(served: RouterProc) -> None:
    doc = httpx.get(served[0] + "/openapi.json").json()
    assert set(doc["paths"]) == {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model_id}",
                                 "/healthz", "/readyz", "/openapi.json"}
    chat = doc["paths"]["/v1/chat/completions"]["post"]["responses"]
    for status in ("400", "401", "404", "413", "429", "431", "502", "503", "504"):
        assert chat[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert doc["components"]["schemas"]["ErrorDetail"]["required"] == ["message", "type", "param", "code"]
    assert "adaptive" in doc["components"]["schemas"]["ChatRequest"]["properties"]["model"]["examples"]


def _big_body(size: int) -> bytes:
    return b'{"model":"adaptive","messages":[{"role":"user","content":"' + b"a" * size + b'"}]}'


def test_oversized_body_gets_a_413_the_client_reads(served: RouterProc) -> None:
    url = served[0]
    body = _big_body(64 << 20)
    with httpx.Client(timeout=60) as http:
        sized = http.post(url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        chunked = http.post(url + "/v1/chat/completions", headers={"content-type": "application/json"},
                            content=(body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)))
        after = http.get(url + "/v1/models")  # the same pool goes on working after both
    for r in (sized, chunked):
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert after.status_code == 200
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-client", max_retries=0, timeout=60)
    with pytest.raises(openai.APIStatusError) as err:
        client.chat.completions.create(model="adaptive", messages=[{"role": "user", "content": "a" * (64 << 20)}])
    assert err.value.status_code == 413 and "server.max_body_bytes" in err.value.message


def test_oversized_headers_get_a_431_naming_the_limit(served: RouterProc) -> None:
    for headers in ({"x-big": "a" * 100_000}, {f"x-h{i}": "a" * 40 for i in range(1500)}):
        r = httpx.get(served[0] + "/v1/models", headers=headers)
        assert r.status_code == 431, r.text
        assert "server.max_header_bytes" in r.json()["error"]["message"]
    assert httpx.get(served[0] + "/v1/models", headers={"x-ok": "a" * 8000}).status_code == 200


def test_too_many_messages_get_a_400_naming_the_field(served: RouterProc) -> None:
    client = openai.OpenAI(base_url=served[0] + "/v1", api_key="sk-client", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="adaptive", messages=[{"role": "user", "content": "x"}] * 5000)
    assert err.value.param == "messages" and "server.max_messages" in err.value.message


def test_deep_json_gets_a_400(served: RouterProc) -> None:
    deep = '{"model":"adaptive","messages":[{"role":"user","content":' + "[" * 5000 + "]" * 5000 + "}]}"
    r = httpx.post(served[0] + "/v1/chat/completions", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
