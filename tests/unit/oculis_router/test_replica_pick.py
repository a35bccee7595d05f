"""The router's replica shell around the picker core: replica sets that drain, leases that count in
flight and set a failed replica aside, discovery sources (config endpoints, the sandbox endpoint map,
EndpointSlices) and the engines' scraped figures."""

from __future__ import annotations

import json

import pytest

from oculis import ConfigError, parse_config
from oculis.endpoint_map import parse
from oculis_router.endpoints import replicas_of
from oculis_router.metrics import Metrics
from oculis_router.pick import Fleet, Pool, Replica
from oculis_router.replicas import at_address, engine_figures, found, metrics_url
from oculis_router.slices import ready_endpoints, service_of

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello " * 40}], "max_tokens": 8}


def pool(n: int = 3, strategy: str = "round-robin") -> Pool:
    p = Pool("llama", strategy, Metrics())
    p.sync([Replica(f"pod-{i}", f"http://127.0.0.1:{9000 + i}/v1") for i in range(n)])
    return p


def test_a_lease_counts_in_flight_until_released() -> None:
    p = pool(2, "least-loaded")
    a = p.lease(BODY, "chat", "stable", set())
    assert a is not None and a.replica.in_flight == 1 and a.replica.in_flight_tokens > 0
    b = p.lease(BODY, "chat", "stable", set())
    assert b is not None and b.replica is not a.replica  # least-loaded: the idle one
    a.release()
    a.release()  # idempotent
    assert a.replica.in_flight == 0 and a.replica.in_flight_tokens == 0 and a.replica.queued_tokens == 0


def test_a_retry_goes_to_a_replica_the_call_has_not_tried_while_one_is_left() -> None:
    p = pool(3)
    tried: set[str] = set()
    for _ in range(3):
        lease = p.lease(BODY, "chat", "stable", tried)
        assert lease is not None and lease.replica.id not in tried
        tried.add(lease.replica.id)
        lease.release()
    assert p.lease(BODY, "chat", "stable", tried) is not None  # all tried: still a replica, never none


def test_a_failed_replica_is_set_aside_but_a_request_is_never_refused_for_it() -> None:
    p = pool(2)
    first = p.lease(BODY, "chat", "stable", set())
    assert first is not None
    first.failed()
    for _ in range(4):
        lease = p.lease(BODY, "chat", "stable", set())
        assert lease is not None and lease.replica is not first.replica
        lease.release()
    other = next(r for r in p.replicas.values() if r is not first.replica)
    other.aside_until = first.replica.aside_until  # both set aside: the picker still picks one
    assert p.lease(BODY, "chat", "stable", set()) is not None


def test_a_replica_that_leaves_drains_its_in_flight_calls_and_is_then_forgotten() -> None:
    p = pool(2)
    leases = [p.lease(BODY, "chat", "stable", set()) for _ in range(2)]
    gone = leases[0].replica if leases[0] else None
    assert gone is not None
    p.sync([r for r in p.replicas.values() if r is not gone])
    assert gone.draining and gone.id in p.replicas  # its call still runs
    for _ in range(4):  # no new request goes there
        lease = p.lease(BODY, "chat", "stable", set())
        assert lease is not None and lease.replica is not gone
        lease.release()
    assert leases[0] is not None
    leases[0].release()
    assert gone.id not in p.replicas


def test_revisions_are_picked_separately() -> None:
    p = Pool("llama", "random", Metrics())
    p.sync([Replica("s-0", "http://127.0.0.1:1/v1"), Replica("c-0", "http://127.0.0.1:2/v1", "canary")])
    for _ in range(5):
        lease = p.lease(BODY, "chat", "canary", set())
        assert lease is not None and lease.replica.id == "c-0"
        lease.release()
    assert p.lease(BODY, "chat", "nonesuch", set()) is None  # no replica of it: the base URL is called


def test_prefix_picks_keep_a_prompt_on_the_replica_that_has_its_prefix() -> None:
    p = pool(4, "prefix")
    first = p.lease(BODY, "chat", "stable", set())
    assert first is not None
    first.release()
    again = p.lease(BODY, "chat", "stable", set())
    assert again is not None and again.replica is first.replica and again.pick.reason == "prefix"


def test_config_endpoints_become_replicas_and_bad_entries_are_one_line() -> None:
    cfg = parse_config("oculis:\n  upstreams:\n  - {name: a, provider: vllm, picker: least-loaded, endpoints: "
                       "[http://127.0.0.1:1/v1, {url: 'http://127.0.0.1:2/v1', kv_events: 'tcp://127.0.0.1:3'}]}\n")
    strategy, reps = found(cfg, None, None)["a"]
    assert strategy == "least-loaded" and [r.url for r in reps] == ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]
    assert reps[1].kv_events == "tcp://127.0.0.1:3" and cfg.upstreams[0].url == "http://127.0.0.1:1/v1"
    with pytest.raises(ConfigError) as err:
        parse_config("oculis:\n  upstreams:\n  - {name: a, provider: vllm, endpoints: [http://h:1/v1, 'h:2']}\n")
    assert "endpoints[1]: 'h:2' is not an http(s) URL" in str(err.value) and len(str(err.value).splitlines()) == 2
    with pytest.raises(ConfigError, match="picker applies to self-hosted replicas; provider openai"):
        parse_config("oculis:\n  upstreams:\n  - {name: a, provider: openai, picker: prefix}\n")


def test_the_endpoint_map_gives_each_pod_its_own_replica() -> None:
    text = json.dumps({"llama-vllm.demo.svc": {"ports": [4001, 4002], "pods": [
        {"pod": "llama-a", "port": 4001, "pid": 1}, {"pod": "llama-b", "port": 4002, "kv_events": "tcp://127.0.0.1:5"}]},
        "other.demo.svc": {"ports": [4003]}})
    pods = replicas_of(parse(text, "map"))
    assert pods["llama-vllm.demo.svc"] == [("llama-a", 4001, None), ("llama-b", 4002, "tcp://127.0.0.1:5")]
    assert pods["other.demo.svc"] == [("other.demo.svc:4003", 4003, None)]  # no pod names: one per port
    assert at_address("http://llama-vllm.demo.svc:8000/v1", "127.0.0.1", 4001) == "http://127.0.0.1:4001/v1"


def test_endpointslices_list_ready_pods_only() -> None:
    assert service_of("http://llama-vllm.demo.svc:8000/v1") == ("demo", "llama-vllm")
    assert service_of("http://llama-vllm.demo.svc.cluster.local:8000/v1") == ("demo", "llama-vllm")
    assert service_of("https://api.openai.com/v1") is None
    s = {"endpoints": [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": True}, "targetRef": {"name": "pod-a"}},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": False, "serving": True, "terminating": True},
         "targetRef": {"name": "pod-b"}},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": False}, "targetRef": {"name": "pod-c"}}]}
    assert ready_endpoints(s) == [("pod-a", "10.0.0.1")]


def test_engine_figures_from_vllm_metrics() -> None:
    text = ('vllm:num_requests_waiting{model_name="m"} 3\nvllm:num_requests_running{model_name="m"} 5\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="2048"} 1\n')
    gauges, bs, blocks, _ = engine_figures(text)
    assert gauges == {"waiting": 3, "running": 5, "kv_usage": 0.25} and (bs, blocks) == (16, 2048)
    assert metrics_url("http://10.0.0.1:8000/v1") == "http://10.0.0.1:8000/metrics"


def test_a_fleet_keeps_an_upstreams_memory_across_syncs_and_drops_it_when_it_has_no_source() -> None:
    fleet = Fleet(Metrics())
    reps = [Replica("a", "http://127.0.0.1:1/v1")]
    fleet.sync({"u": ("prefix", reps)})
    pool_before = fleet.pools["u"]
    fleet.sync({"u": ("prefix", [Replica("a", "http://127.0.0.1:1/v1")])})
    assert fleet.pools["u"] is pool_before
    fleet.sync({})
    assert "u" not in fleet.pools


def test_the_decision_log_records_the_replica() -> None:
    from oculis.router import DecisionLog
    from oculis_router.decisionlog import entry

    line = entry(DecisionLog(), "chat", BODY, 0.2, 0.9, 40, 200,
                 {"x-oculis-tier": "small", "x-oculis-upstream": "llama", "x-oculis-replica": "llama-vllm-7c9d-abcde"})
    assert line["replica"] == "llama-vllm-7c9d-abcde" and line["upstream"] == "llama"
