"""The endpoint picker's pure decisions (oculis_router.epp.decisions) and message reading/building."""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from google.protobuf import struct_pb2

from oculis_router.epp import decisions as d
from oculis_router.epp import messages as m
from oculis_router.errors import APIError


def test_endpoint_of_paths() -> None:
    assert d.endpoint_of("/v1/chat/completions?x=1") == "chat"
    assert d.endpoint_of("/v1/completions") == "completions"
    assert d.endpoint_of("/v1/models") is None


@pytest.mark.parametrize(("raw", "endpoint", "param", "code"), [
    (b"{", "chat", None, "invalid_json"),
    (b"[]", "chat", None, None),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "chat", "model", None),
    (b'{"model": "m"}', "chat", "messages", None),
    (b'{"model": "m"}', "completions", "prompt", None),
])
def test_bad_bodies_are_the_routers_400s(raw: bytes, endpoint: d.Endpoint, param: str | None,
                                         code: str | None) -> None:
    with pytest.raises(APIError) as e:
        d.parse_body(raw, endpoint, 2048)
    assert e.value.status == 400 and e.value.param == param and e.value.code == code


def test_a_body_is_kept_as_sent() -> None:
    sent, checked = d.parse_body(b'{"model": "m", "prompt": "p", "user": null}', "completions", 10)
    assert sent == {"model": "m", "prompt": "p", "user": None} and "user" not in checked


def test_allowed_takes_reachable_replicas_within_the_subset() -> None:
    addrs = {"a": "10.0.0.1:8000", "b": "10.0.0.2:8000", "c": "10.0.0.3:8000"}
    assert d.allowed(addrs, ["a", "b"], None) == {"a", "b"}
    assert d.allowed(addrs, ["a", "b", "c"], ["10.0.0.3:8000", "10.0.0.9:1"]) == {"c"}
    assert d.allowed(addrs, ["a"], []) == set()


def test_fallback_order_is_the_pick_then_least_loaded() -> None:
    assert d.fallback_order("p:1", [("x:1", 3), ("y:1", 1), ("p:1", 0)], 5) == ["p:1", "y:1", "x:1"]
    assert d.fallback_order("p:1", [("x:1", 3), ("y:1", 1)], 1) == ["p:1", "y:1"]
    assert d.fallback_order("p:1", [("x:1", 3)], 0) == ["p:1"]


def test_shed_only_when_every_candidate_queue_is_long() -> None:
    assert not d.shed([5, 1], None)
    assert not d.shed([5, 1], 4)
    assert d.shed([5, 4], 4)
    assert not d.shed([], 4)


def test_address_of_urls() -> None:
    assert d.address_of("http://10.1.2.3:8000/v1") == "10.1.2.3:8000"
    assert d.address_of("http://pod/v1") == "pod:80"


def test_subset_hint_and_served_are_read_from_metadata() -> None:
    req = ep.ProcessingRequest()
    assert m.subset_hint(req) is None
    hint = struct_pb2.Struct()
    hint.update({d.SUBSET_KEY: ["1.1.1.1:80", "2.2.2.2:80"]})
    req.metadata_context.filter_metadata[d.SUBSET_NAMESPACE].CopyFrom(hint)
    assert m.subset_hint(req) == ["1.1.1.1:80", "2.2.2.2:80"]
    lb = struct_pb2.Struct()
    lb.update({d.SERVED_KEY: "2.2.2.2:80"})
    req.metadata_context.filter_metadata[d.LB_NAMESPACE].CopyFrom(lb)
    assert m.served(req, {d.SERVED_KEY: "9.9.9.9:1"}) == "2.2.2.2:80"  # metadata first
    assert m.served(ep.ProcessingRequest(), {d.SERVED_KEY: "9.9.9.9:1"}) == "9.9.9.9:1"


def test_the_pick_is_the_same_in_header_and_metadata() -> None:
    answer = d.Answer(["1.1.1.1:80", "2.2.2.2:80"], {d.DESTINATION: "1.1.1.1:80,2.2.2.2:80"})
    resp = m.request_headers(answer.headers, (d.DESTINATION, answer.value))
    header = resp.request_headers.response.header_mutation.set_headers[0].header
    assert header.key == d.DESTINATION and header.raw_value.decode() == answer.value
    assert resp.dynamic_metadata.fields[d.LB_NAMESPACE].struct_value.fields[d.DESTINATION].string_value == \
        answer.value
    assert resp.request_headers.response.clear_route_cache


def test_a_large_body_goes_back_in_pieces_and_ends_once() -> None:
    body = b"x" * (m.CHUNK * 2 + 5)
    parts = list(m.streamed_body(body))
    assert b"".join(p.request_body.response.body_mutation.streamed_response.body for p in parts) == body
    assert [p.request_body.response.body_mutation.streamed_response.end_of_stream for p in parts] == [
        False, False, True]


def test_an_immediate_error_is_openai_shaped() -> None:
    resp = m.immediate(d.no_replica("upstream 'x'", None, 2))
    ir = resp.immediate_response
    assert ir.status.code == 503
    assert set(json.loads(ir.body)["error"]) == {"message", "type", "param", "code"}
    assert {h.header.key for h in ir.headers.set_headers} >= {"content-type", "retry-after"}
