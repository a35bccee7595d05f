"""The router's replica shell for LoRA adapters: leases only on replicas listing the adapter, their
in-flight adapters, what the engines' /metrics and /v1/models say, the 503 when none lists it, and the
per-adapter cost counters."""

from __future__ import annotations

import pytest

from oculis import RouterConfig
from oculis_router.metrics import Metrics
from oculis_router.pick import AdapterMissing, Fleet, Pool, Replica, adapter_of
from oculis_router.picking import LoraSlots
from oculis_router.relay import account
from oculis_router.replicas import engine_figures, found, listed_adapters
from oculis_router.verdicts import AdapterUnavailable, failure_kind

BODY = {"model": "sql", "messages": [{"role": "user", "content": "select " * 40}], "max_tokens": 8}
CONFIG = {"upstreams": [{"name": "llama", "provider": "vllm", "adapters": ["sql", "support"],
                         "pricing": {"input_per_mtok": 1.0, "output_per_mtok": 2.0},
                         "endpoints": ["http://127.0.0.1:32001/v1", "http://127.0.0.1:32002/v1"]},
                        {"name": "plain", "provider": "vllm", "endpoints": ["http://127.0.0.1:32003/v1"]}],
          "routes": []}


def pool(lists: dict[str, frozenset[str] | None], strategy: str = "least-loaded") -> Pool:
    p = Pool("llama", strategy, Metrics())
    p.sync([Replica(rid, f"http://127.0.0.1:{32000 + i}/v1", adapters=a) for i, (rid, a) in enumerate(lists.items())])
    return p


def test_leases_go_only_to_replicas_listing_the_adapter_and_count_it_in_flight() -> None:
    p = pool({"a": frozenset({"support"}), "b": frozenset({"sql"}), "c": frozenset({"sql", "support"})})
    leases = [p.lease(BODY, "chat", "stable", set(), "sql") for _ in range(4)]
    chosen = {lease.replica.id for lease in leases if lease}
    assert len(chosen) == 1 and chosen <= {"b", "c"}  # sticky: the first call's replica runs sql now
    r = p.replicas[chosen.pop()]
    assert r.in_flight_adapters["sql"] == 4 and r.state(0.0, True).in_flight_adapters == frozenset({"sql"})
    for lease in leases:
        assert lease is not None
        lease.release()
    assert not r.in_flight_adapters  # released: no adapter left in flight there
    base = {p.lease({**BODY, "model": "m"}, "chat", "stable", set()).replica.id for _ in range(6)}  # type: ignore[union-attr]
    assert "a" in base  # the base model goes anywhere


def test_a_retry_stays_among_the_holders() -> None:
    p = pool({"a": frozenset(), "b": frozenset({"sql"}), "c": frozenset({"sql"})}, "round-robin")
    first = p.lease(BODY, "chat", "stable", set(), "sql")
    assert first is not None
    second = p.lease(BODY, "chat", "stable", {first.replica.id}, "sql")
    assert second is not None and second.replica.id in {"b", "c"} - {first.replica.id}
    third = p.lease(BODY, "chat", "stable", {"b", "c"}, "sql")  # every holder tried: a holder again, never a
    assert third is not None and third.replica.id in {"b", "c"}


def test_no_replica_listing_the_adapter_is_a_503_naming_it() -> None:
    p = pool({"a": frozenset({"support"}), "b": frozenset()})
    with pytest.raises(AdapterMissing) as missing:
        p.lease(BODY, "chat", "stable", set(), "sql")
    err = AdapterUnavailable(missing.value).client_error("llama")
    assert err.status == 503 and err.code == "adapter_not_loaded" and err.headers["retry-after"] == "5"
    assert "'sql'" in err.message and "llama" in err.message and "support" in err.message
    assert failure_kind(AdapterUnavailable(missing.value).verdict) == "adapter_not_loaded"
    unread = pool({"a": frozenset({"support"}), "new": None})
    lease = unread.lease(BODY, "chat", "stable", set(), "sql")
    assert lease is not None and lease.replica.id == "new"  # not read yet: it may have it


def test_a_draining_holder_gets_no_adapter_call() -> None:
    p = pool({"a": frozenset({"sql"}), "b": frozenset()})
    p.sync([Replica("b", "http://127.0.0.1:32001/v1", adapters=frozenset())])  # a leaves: drains
    with pytest.raises(AdapterMissing):
        p.lease(BODY, "chat", "stable", set(), "sql")


def test_fleet_reads_the_adapter_from_the_upstream_as_called() -> None:
    from oculis_router.adapters import with_adapter

    cfg = RouterConfig.model_validate(CONFIG)
    up = cfg.upstream("llama")
    assert adapter_of(up) is None and adapter_of(with_adapter(up, "sql")) == "sql"
    fleet = Fleet(Metrics())
    fleet.sync(found(cfg, None, None))
    reps = fleet.pools["llama"].replicas
    assert all(r.serves_adapters for r in reps.values())
    assert not any(r.serves_adapters for r in fleet.pools["plain"].replicas.values())
    for r, names in zip(reps.values(), (frozenset({"support"}), frozenset({"sql"})), strict=True):
        r.adapters = names
    lease = fleet.lease(with_adapter(up, "sql"), BODY, "chat", "stable", set())
    assert lease is not None and lease.replica.adapters == frozenset({"sql"})


def test_engine_figures_take_the_latest_lora_label_set() -> None:
    text = ('vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,support",waiting_lora_adapters=""} '
            '1.7e9\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.6e9\n')
    *_, lora = engine_figures(text)
    assert lora == LoraSlots(2, frozenset({"sql", "support"}), frozenset())
    assert engine_figures('vllm:num_requests_running{model_name="m"} 1\n')[3] is None  # no --enable-lora


def test_listed_adapters_are_the_entries_with_a_parent() -> None:
    payload = {"object": "list", "data": [{"id": "tiny", "parent": None}, {"id": "sql", "parent": "tiny"},
                                          {"id": "support", "parent": "tiny", "root": "/adapters/support"}]}
    assert listed_adapters(payload) == frozenset({"sql", "support"})
    with pytest.raises(ValueError):
        listed_adapters({"error": "nope"})


def test_an_adapter_calls_cost_is_counted_per_adapter_too() -> None:
    from oculis_router.adapters import with_adapter

    m = Metrics()
    up = RouterConfig.model_validate(CONFIG).upstream("llama")
    account(m, with_adapter(up, "sql"), {"prompt_tokens": 1000, "completion_tokens": 500})
    account(m, up, {"prompt_tokens": 1000, "completion_tokens": 500})  # the base model: no adapter series

    def value(name: str, **labels: str) -> float:
        return m.registry.get_sample_value(name, labels) or 0.0

    assert value("oculis_adapter_cost_dollars_total", upstream="llama", adapter="sql") == pytest.approx(0.002)
    assert value("oculis_cost_dollars_total", upstream="llama") == pytest.approx(0.004)  # unchanged: both calls
    assert value("oculis_adapter_prompt_tokens_total", upstream="llama", adapter="sql") == 1000
    assert value("oculis_adapter_completion_tokens_total", upstream="llama", adapter="sql") == 500


def test_a_canary_without_the_adapter_yet_sends_the_call_to_stable() -> None:
    from oculis_router.adapters import with_adapter
    from oculis_router.revisions import Revisions

    cfg = RouterConfig.model_validate({"upstreams": [{
        "name": "llama", "provider": "vllm", "adapters": ["sql"], "base_url": "http://llama.ns.svc:8000/v1",
        "canary": {"base_url": "http://llama-canary.ns.svc:8000/v1", "percent": 50}}], "routes": []})
    up = with_adapter(cfg.upstream("llama"), "sql")
    fleet = Fleet(Metrics())
    fleet.sync({"llama": ("least-loaded", [
        Replica("stable-0", "http://127.0.0.1:32011/v1", "stable", adapters=frozenset({"sql"})),
        Replica("canary-0", "http://127.0.0.1:32012/v1", "canary", adapters=frozenset())])})  # not loaded yet
    revs = Revisions(up, "chat", BODY, 0.0, fleet)  # a draw of 0: the canary
    assert revs.first == "canary"
    rev, (url, _, payload), lease = revs.next()
    assert (rev, lease is not None and lease.replica.id) == ("stable", "stable-0")
    assert url.startswith("http://127.0.0.1:32011/v1") and payload["model"] == "sql"


def test_adapter_not_loaded_message_without_kubernetes() -> None:
    """Q19: the router cannot tell an operator-rendered config from a hand-written one, so the 503 claims
    no GPUUpstream: it names what the engines list, how to load the adapter, and the GPUUpstream as a case."""
    p = pool({"a": frozenset({"support"}), "b": frozenset()})
    with pytest.raises(AdapterMissing) as missing:
        p.lease(BODY, "chat", "stable", set(), "sql")
    message = AdapterUnavailable(missing.value).client_error("llama").message
    assert "their engines' /v1/models list: support)" in message and "--lora-modules" in message
    assert "if a GPUUpstream manages 'llama'" in message and "`kubectl get gu llama` (ADAPTERS)" in message
    assert "its GPUUpstream status says" not in message
