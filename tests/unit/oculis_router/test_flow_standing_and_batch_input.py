"""A request's flow-control standing (flow, priority, weight) from the route, the key's override and the
X-Oculis-Priority header, within what the key may ask; and batch input files checked line by line."""

from __future__ import annotations

import json

import pytest

from oculis.router import Route, ServerSettings
from oculis_router.batch.check import InputError, check_for_batch, parse_input
from oculis_router.flowcontrol.standing import PriorityRefused, standing
from oculis_router.limits import Identity

SERVER = ServerSettings.model_validate({"limit_overrides": [
    {"match": {"tenant": "vip"}, "max_priority": 20, "priority": 5, "weight": 3},
    {"match": {"key_sha256": "ab" * 8}, "priority": -50}]})
ROUTE = Route.model_validate({"name": "chat", "tiers": [{"name": "t", "upstream": "u"}],
                              "flow_control": {"priority": 2}})


def who(tenant_header: str | None = None, key: str = "cd" * 32) -> Identity:
    return Identity(f"key-{key[:16]}" + (f"/{tenant_header}" if tenant_header else ""), key, tenant_header)


def test_priority_comes_from_header_then_key_then_route() -> None:
    assert standing(SERVER, ROUTE, who(), "chat", None).priority == 2
    assert standing(SERVER, ROUTE, who(key="ab" * 32), "chat", None).priority == -50
    vip = standing(SERVER, ROUTE, who("vip"), "chat", None)
    assert (vip.priority, vip.weight, vip.flow) == (5, 3, who("vip").tenant)
    assert standing(SERVER, ROUTE, who("vip"), "chat", "20").priority == 20
    assert standing(SERVER, ROUTE, who(), "chat", "-100").priority == -100


def test_a_priority_above_the_allowance_is_403_naming_the_range_and_junk_is_400() -> None:
    with pytest.raises(PriorityRefused) as e:
        standing(SERVER, ROUTE, who(), "chat", "1")
    assert e.value.status == 403 and "-100 to 0" in str(e.value)
    with pytest.raises(PriorityRefused) as e:
        standing(SERVER, ROUTE, who("vip"), "chat", "21")
    assert e.value.status == 403 and "-100 to 20" in str(e.value)
    for bad in ("high", "1.5", "-101"):
        with pytest.raises(PriorityRefused) as e:
            standing(SERVER, ROUTE, who(), "chat", bad)
        assert e.value.status == 400


def test_the_fairness_key_can_be_the_key_or_the_route() -> None:
    by_key = ServerSettings.model_validate({"flow_control": {"fairness": "key"}})
    assert standing(by_key, None, who("a"), "chat", None).flow == standing(by_key, None, who("b"), "chat", None).flow
    by_route = ServerSettings.model_validate({"flow_control": {"fairness": "route"}})
    assert standing(by_route, None, who("a"), "chat", None).flow == "chat"


def line(i: int, **over: object) -> bytes:
    doc = {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}}
    doc.update(over)
    return json.dumps(doc).encode() + b"\n"


@pytest.mark.parametrize(("data", "where", "field"), [
    (line(0) + b"{not json\n", 2, None),
    (line(0) + b"[1, 2]\n", 2, None),
    (line(0) + line(0), 2, "custom_id"),
    (line(0, method="GET"), 1, "method"),
    (line(0, url="/v1/embeddings"), 1, "url"),
    (line(0, body={"messages": []}), 1, "body.model"),
    (line(0, body={"model": "chat", "stream": True}), 1, "body.stream"),
])
def test_a_bad_line_is_refused_naming_its_number_and_field(data: bytes, where: int, field: str | None) -> None:
    with pytest.raises(InputError) as e:
        parse_input(data, 10, 10_000)
    assert e.value.line == where and str(e.value).startswith(f"line {where}:")
    if field:
        assert e.value.param == field


def test_bounds_blank_lines_and_the_batch_checks() -> None:
    with pytest.raises(InputError, match="max_requests_per_batch"):
        parse_input(line(0) + line(1) + line(2), 2, 10_000)
    with pytest.raises(InputError, match="max_file_bytes"):
        parse_input(line(0) * 3, 10, 100)
    with pytest.raises(InputError, match="no request"):
        parse_input(b"\n\n", 10, 100)
    lines = parse_input(line(0) + b"\n" + line(1), 10, 10_000)
    assert [(x.n, x.custom_id, x.endpoint) for x in lines] == [(1, "c0", "chat"), (3, "c1", "chat")]
    check_for_batch(lines, "/v1/chat/completions", {"chat"})
    with pytest.raises(InputError, match=r"line 1: .*differs"):
        check_for_batch(lines, "/v1/completions", {"chat"})
    with pytest.raises(InputError, match=r"line 1: body\.model 'chat' is not a route"):
        check_for_batch(lines, "/v1/chat/completions", {"other"})
