"""The endpoint picker's decision over the router's own parts (config, Fleet, plan), without a network:
replicas from the config's `endpoints`, reachability set by hand as the probes would."""

from __future__ import annotations

import json

import pytest

from oculis import parse_config
from oculis_router.epp.core import Picker, target_problem
from oculis_router.errors import APIError
from oculis_router.metrics import Metrics
from oculis_router.state import ConfigHolder

CONFIG = """
oculis:
  upstreams:
    - {name: small, provider: vllm, model: small-model, picker: round-robin,
       endpoints: [http://127.0.0.1:7001/v1, http://127.0.0.1:7002/v1, http://127.0.0.1:7003/v1]}
    - {name: gpt, provider: openai, model: gpt-4o, api_key_env: OCULIS_TEST_UNSET}
  routes:
    - name: mixed
      escalation: {enabled: false}
      tiers:
        - {name: hosted, match: {max_prompt_tokens: 1000}, upstream: gpt}
        - {name: own, match: {}, upstream: small}
"""
CHAT = json.dumps({"model": "x", "messages": [{"role": "user", "content": "hello"}]}).encode()
ADDRS = {"127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"}


def picker(**kw: object) -> Picker:
    holder = ConfigHolder(None, Metrics(), parse_config(CONFIG, "test"))
    p = Picker(holder, holder.metrics, **kw)  # type: ignore[arg-type]
    p.sync()
    p.probed = True
    return p


def test_targets_it_cannot_serve_are_named() -> None:
    holder = ConfigHolder(None, Metrics(), parse_config(CONFIG, "test"))
    assert target_problem(holder, "small", None) is None
    assert "external provider" in (target_problem(holder, "gpt", None) or "")
    assert target_problem(holder, None, "mixed") is None  # one self-hosted tier is enough


def test_upstream_mode_picks_a_reachable_replica_and_holds_it_until_release() -> None:
    p = picker(upstream="small")
    d = p.decide("chat", CHAT, None)
    assert d.answer.destinations[0] in ADDRS and d.answer.body is None  # body forwarded unchanged
    assert d.lease.replica.in_flight == 1
    d.lease.release()
    assert d.lease.replica.in_flight == 0
    p.down = {"http://127.0.0.1:7001/v1", "http://127.0.0.1:7002/v1"}
    assert {p.decide("chat", CHAT, None).address for _ in range(4)} == {"127.0.0.1:7003"}
    assert p.ready()
    p.down.add("http://127.0.0.1:7003/v1")
    assert not p.ready()
    with pytest.raises(APIError) as e:
        p.decide("chat", CHAT, None)
    assert e.value.status == 503 and e.value.code == "no_replica"


def test_subset_hint_and_fallback_list() -> None:
    p = picker(upstream="small", fallbacks=5)
    d = p.decide("chat", CHAT, ["127.0.0.1:7002", "127.0.0.1:7003"])
    assert set(d.answer.destinations) == {"127.0.0.1:7002", "127.0.0.1:7003"}
    assert d.answer.headers["x-gateway-destination-endpoint"] == d.answer.value
    with pytest.raises(APIError) as e:
        p.decide("chat", CHAT, [])
    assert e.value.status == 503


def test_served_elsewhere_sets_the_pick_aside() -> None:
    p = picker(upstream="small")
    d = p.decide("chat", CHAT, None)
    other = next(a for a in ADDRS if a != d.address)
    p.served(d, other, "200")
    assert all(p.decide("chat", CHAT, None).address != d.address for _ in range(6))


def test_the_proxys_own_503_without_a_served_endpoint_sets_it_aside_too() -> None:
    p = picker(upstream="small")
    d = p.decide("chat", CHAT, None)
    p.served(d, None, "503")
    assert all(p.decide("chat", CHAT, None).address != d.address for _ in range(6))


def test_route_mode_skips_external_tiers_and_rewrites_the_model() -> None:
    p = picker(route="mixed")
    d = p.decide("chat", CHAT, None)
    assert d.answer.headers["x-oculis-tier"] == "own" and d.answer.headers["x-oculis-upstream"] == "small"
    assert d.answer.headers["x-oculis-route"] == "mixed"
    assert json.loads(d.answer.body or b"")["model"] == "small-model"


def test_bad_bodies_are_refused_before_any_pick() -> None:
    p = picker(upstream="small")
    for raw, status in ((b"nope", 400), (b'{"model": "m"}', 400), (b"x" * (5 * 1024 * 1024), 413)):
        with pytest.raises(APIError) as e:
            p.decide("chat", raw, None)
        assert e.value.status == status
    assert all(r.in_flight == 0 for pool in p.pools() for r in pool.replicas.values())


async def test_the_endpoint_map_gives_the_pods_of_an_in_cluster_upstream(tmp_path: object) -> None:
    from pathlib import Path

    from oculis_router.endpoints import EndpointResolver

    path = Path(str(tmp_path)) / "endpoints.yaml"
    path.write_text("llama-8b-vllm.demo.svc: {ports: [7101, 7102], namespace: demo, "
                    "pods: [{pod: llama-a, port: 7101}, {pod: llama-b, port: 7102}]}\n")
    cfg = parse_config("oculis: {upstreams: [{name: llama, provider: vllm, model: m, "
                       "base_url: 'http://llama-8b-vllm.demo.svc:8000/v1'}]}", "test")
    holder = ConfigHolder(None, Metrics(), cfg)
    p = Picker(holder, holder.metrics, upstream="llama", resolver=EndpointResolver(path))
    p.sync()
    assert {p.decide("chat", CHAT, None).lease.replica.id for _ in range(8)} <= {"llama-a", "llama-b"}
    assert {r.url for pool in p.pools() for r in pool.replicas.values()} == {
        "http://127.0.0.1:7101/v1", "http://127.0.0.1:7102/v1"}
