"""The ext_proc protobuf messages: reading the proxy's (headers, subset hint, served endpoint) and
building the picker's answers (header and body mutations, dynamic metadata, immediate responses)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from oculis_router.epp.decisions import LB_NAMESPACE, SERVED_KEY, SUBSET_KEY, SUBSET_NAMESPACE
from oculis_router.errors import APIError

# One body message at most this large: gRPC refuses messages over 4 MiB by default on both ends, and the
# router's body limit is 4 MiB, so a rewritten body goes back in pieces.
CHUNK = 1024 * 1024


def header_map(headers: base_pb2.HeaderMap) -> dict[str, str]:
    """The proxy's headers (lower-case names; Envoy sends values as raw bytes)."""
    return {h.key.lower(): (h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value)
            for h in headers.headers}


def _namespace(md: base_pb2.Metadata, ns: str) -> struct_pb2.Struct | None:
    return md.filter_metadata.get(ns, None)


def subset_hint(req: ep.ProcessingRequest) -> list[str] | None:
    """The proxy's candidate subset (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset`), or
    None when it sent none (then any replica may serve)."""
    s = _namespace(req.metadata_context, SUBSET_NAMESPACE)
    if s is None or SUBSET_KEY not in s.fields:
        return None
    v = s.fields[SUBSET_KEY]
    if v.HasField("list_value"):
        return [x.string_value for x in v.list_value.values if x.string_value]
    return [a.strip() for a in v.string_value.split(",") if a.strip()]


def served(req: ep.ProcessingRequest, headers: dict[str, str]) -> str | None:
    """The endpoint that answered: `envoy.lb` / `x-gateway-destination-endpoint-served` metadata (the
    protocol's way), else the same-named response header (a plain Envoy route can add it from
    %UPSTREAM_REMOTE_ADDRESS%, as examples/envoy does)."""
    s = _namespace(req.metadata_context, LB_NAMESPACE)
    if s is not None and SERVED_KEY in s.fields and s.fields[SERVED_KEY].string_value:
        return str(s.fields[SERVED_KEY].string_value)
    return headers.get(SERVED_KEY) or None


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=key, raw_value=value.encode()),
                                      append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)


def lb_metadata(key: str, value: str) -> struct_pb2.Struct:
    md = struct_pb2.Struct()
    md.get_or_create_struct(LB_NAMESPACE)[key] = value
    return md


def request_headers(set_headers: dict[str, str], destination: tuple[str, str] | None,
                    remove: Sequence[str] = ()) -> ep.ProcessingResponse:
    """The answer to the request headers: the mutations, the route cache cleared (the destination header
    changed the route's input), and the destination in `envoy.lb` dynamic metadata."""
    mutation = ep.HeaderMutation(set_headers=[_set(k, v) for k, v in set_headers.items()], remove_headers=list(remove))
    resp = ep.ProcessingResponse(request_headers=ep.HeadersResponse(
        response=ep.CommonResponse(header_mutation=mutation, clear_route_cache=True)))
    if destination is not None:
        resp.dynamic_metadata.CopyFrom(lb_metadata(*destination))
    return resp


def response_headers(remove: Sequence[str] = ()) -> ep.ProcessingResponse:
    return ep.ProcessingResponse(response_headers=ep.HeadersResponse(
        response=ep.CommonResponse(header_mutation=ep.HeaderMutation(remove_headers=list(remove)))))


def streamed_body(body: bytes, response: bool = False, end: bool = True) -> Iterator[ep.ProcessingResponse]:
    """The body back to the proxy as streamed pieces (FULL_DUPLEX_STREAMED), the last one ending the stream."""
    pieces = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)] or [b""]
    for i, piece in enumerate(pieces):
        common = ep.CommonResponse(body_mutation=ep.BodyMutation(streamed_response=ep.StreamedBodyResponse(
            body=piece, end_of_stream=end and i == len(pieces) - 1)))
        yield (ep.ProcessingResponse(response_body=ep.BodyResponse(response=common)) if response
               else ep.ProcessingResponse(request_body=ep.BodyResponse(response=common)))


def trailers(response: bool) -> ep.ProcessingResponse:
    return (ep.ProcessingResponse(response_trailers=ep.TrailersResponse()) if response
            else ep.ProcessingResponse(request_trailers=ep.TrailersResponse()))


def immediate(err: APIError) -> ep.ProcessingResponse:
    """An OpenAI-shaped error sent by the proxy in place of the upstream's answer."""
    hdrs = {"content-type": "application/json", **err.headers}
    return ep.ProcessingResponse(immediate_response=ep.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=err.status),
        headers=ep.HeaderMutation(set_headers=[_set(k, v) for k, v in hdrs.items()]),
        body=json.dumps(err.body()).encode(), details=f"oculis_epp_{err.code or err.status}"))
