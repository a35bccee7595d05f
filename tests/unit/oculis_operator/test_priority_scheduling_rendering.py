"""engine.schedulerPolicy: priority renders vLLM's --scheduling-policy=priority and tells the router the
engine takes a `priority` field (priority_scheduling), so flow control's priorities reach the engine."""

from __future__ import annotations

from typing import Any

from oculis.router import RouterConfig
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import engine_args
from oculis_operator.upstream_entry import upstream_entry

VLLM: dict[str, Any] = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
                        "gpu": {"product": "H100-80GB", "count": 1}}


def obj(engine: dict[str, Any] | None) -> dict[str, Any]:
    spec = {**VLLM, **({"engine": engine} if engine is not None else {})}
    return {"metadata": {"name": "llama", "namespace": "demo", "generation": 1}, "spec": spec,
            "status": {"engineHash": "abc"}}


def test_priority_policy_reaches_the_engine_flags_and_the_router_config() -> None:
    o = obj({"schedulerPolicy": "priority"})
    spec = GPUUpstreamSpec.model_validate(o["spec"])
    assert "--scheduling-policy=priority" in engine_args.build(spec, {})
    entry, _ = upstream_entry(o)
    assert entry["priority_scheduling"] is True
    assert RouterConfig.model_validate({"upstreams": [entry]}).upstreams[0].priority_scheduling


def test_fcfs_or_no_engine_section_leaves_the_field_unset() -> None:
    for engine in (None, {"schedulerPolicy": "fcfs"}):
        entry, _ = upstream_entry(obj(engine))
        assert "priority_scheduling" not in entry
