"""spec.adapters rendered: vLLM 0.32's LoRA flags (spelling checked with its own parser by
tests/realengine), the runtime-updating env (adapters then loaded through the engine's API, so adding or
removing one keeps the pod template), adapter volumes, and the router config's adapter names."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from oculis.adapters import volume_name
from oculis.router import RouterConfig
from oculis.upstream import GPUUpstreamSpec
from oculis_operator import drift, engine_args, render
from oculis_operator.routeconfig import render_namespace
from oculis_operator.upstream_entry import upstream_entry

VLLM: dict[str, Any] = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
                        "gpu": {"product": "H100-80GB", "count": 1}}
ADAPTERS = [{"name": "sql", "source": {"huggingFace": "org/sql-lora"}, "rank": 32},
            {"name": "style", "source": {"pvc": {"name": "loras", "subPath": "style"}}}]


def test_adapters_render_the_lora_flags_env_and_volumes() -> None:
    spec = GPUUpstreamSpec.model_validate({**VLLM, "engine": {"maxLoras": 2, "maxLoraRank": 32}, "adapters": ADAPTERS})
    argv = engine_args.build(spec, {})
    at = argv.index("--enable-lora")
    # Loaded through the engine's API (the default): the adapter set is not in the argv.
    assert argv[at:] == ["--enable-lora", "--max-loras=2", "--max-lora-rank=32"]
    pod = render.pod_template("llama", spec, argv, 0)
    c = pod["spec"]["containers"][0]
    assert c["env"] == [{"name": "VLLM_ALLOW_RUNTIME_LORA_UPDATING", "value": "True"}, render.engine_key_env("llama")]
    vol = volume_name("style")
    assert {"name": vol, "mountPath": "/adapters/style", "readOnly": True} in c["volumeMounts"]
    assert {"name": vol, "persistentVolumeClaim": {"claimName": "loras", "readOnly": True}} in pod["spec"]["volumes"]
    dep = render.deployment("llama", "demo", "uid", spec, argv, 0, {"maxSurge": 0, "maxUnavailable": 1})
    assert drift.differences(dep, copy.deepcopy(dep), drift.DEPLOYMENT) == []  # the env is ours, not drift


def test_without_runtime_updating_the_adapters_are_lora_modules_flags() -> None:
    spec = GPUUpstreamSpec.model_validate({**VLLM, "engine": {"maxLoras": 2, "maxLoraRank": 32,
                                                              "runtimeLoraUpdating": False}, "adapters": ADAPTERS})
    argv = engine_args.build(spec, {})
    at = argv.index("--enable-lora")
    assert argv[at:] == ["--enable-lora", "--max-loras=2", "--max-lora-rank=32", "--lora-modules",
                         "sql=org/sql-lora", "style=/adapters/style/style"]
    # no runtime-updating variable: only the engine's API key
    assert render.pod_template("llama", spec, argv, 0)["spec"]["containers"][0]["env"] == [
        render.engine_key_env("llama")]


def engine_hash(body: dict[str, Any]) -> str:
    spec = GPUUpstreamSpec.model_validate(body)
    return str(render.pod_template("llama", spec, engine_args.build(spec, {}), 0)["metadata"]["annotations"][
        render.ENGINE_HASH])


def test_adding_or_removing_a_runtime_adapter_keeps_the_pod_template() -> None:
    """Nothing restarts: the template (and so the engine hash) is the same with 0, 1 or 2 hub/path adapters
    while LoRA is on (adapters: [] or engine.maxLoras keeps it on); a PVC adapter adds a volume, maxLoras and
    the opt-out change the engine, and turning LoRA on or off does too."""
    hub = {"name": "sql", "source": {"huggingFace": "org/sql-lora"}}
    path = {"name": "one", "source": {"path": "/models/one"}}
    engine = {"maxLoras": 2}
    base = engine_hash({**VLLM, "engine": engine, "adapters": []})
    assert engine_hash({**VLLM, "engine": engine, "adapters": [hub]}) == base
    assert engine_hash({**VLLM, "engine": engine, "adapters": [hub, path]}) == base
    assert engine_hash({**VLLM, "engine": engine}) == base  # maxLoras alone keeps LoRA on
    assert engine_hash({**VLLM, "adapters": [hub]}) == engine_hash({**VLLM, "adapters": []})
    assert engine_hash({**VLLM, "engine": engine, "adapters": [hub, ADAPTERS[1]]}) != base  # its volume
    assert engine_hash({**VLLM, "engine": {"maxLoras": 4}, "adapters": [hub]}) != base
    assert engine_hash({**VLLM, "engine": {**engine, "runtimeLoraUpdating": False}, "adapters": [hub]}) != base
    assert engine_hash(VLLM) != engine_hash({**VLLM, "adapters": []})  # --enable-lora: an engine change


def test_without_adapters_nothing_changes_and_defaults_are_vllms() -> None:
    plain = GPUUpstreamSpec.model_validate(VLLM)
    argv = engine_args.build(plain, {})
    assert not any("lora" in a for a in argv)
    assert render.pod_template("llama", plain, argv, 0)["spec"]["containers"][0]["env"] == [
        render.engine_key_env("llama")]
    one = GPUUpstreamSpec.model_validate({**VLLM, "adapters": [{"name": "a", "source": {"path": "/a"}}],
                                          "engine": {"runtimeLoraUpdating": False}})
    assert engine_args.build(one, {})[-5:] == ["--enable-lora", "--max-loras=1", "--max-lora-rank=16",
                                               "--lora-modules", "a=/a"]


def test_lora_flags_in_extra_args_are_refused() -> None:
    with pytest.raises(engine_args.ExtraArgError, match="--max-loras is set by Oculis"):
        engine_args.build(GPUUpstreamSpec.model_validate({**VLLM, "engine": {"extraArgs": ["--max-loras=4"]}}), {})


def _upstream(adapters: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "demo", "generation": 1},
            "spec": {**VLLM, "adapters": adapters},
            "status": {"engineHash": "abc", "servedModel": "llama", "readyReplicas": 2,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "Ready"}]}}


def test_the_router_config_lists_the_adapters_and_a_tier_naming_another_is_left_out() -> None:
    entry, _ = upstream_entry(_upstream(ADAPTERS))
    assert entry["adapters"] == ["sql", "style"]
    assert RouterConfig.model_validate({"upstreams": [entry]}).upstreams[0].adapters == ["sql", "style"]
    route = {"metadata": {"name": "chat", "namespace": "demo", "generation": 1},
             "spec": {"tiers": [{"name": "sql", "upstream": "llama", "adapter": "billing"}]}}
    out = render_namespace([route], [_upstream(ADAPTERS)])
    verdict = out.routes["chat"]
    assert verdict.reason == "InvalidRouterConfig"
    assert "adapter 'billing' is not declared by upstream 'llama' (its adapters: sql, style)" in verdict.message
    with pytest.raises(ValidationError):
        GPUUpstreamSpec.model_validate({**VLLM, "adapters": [{"name": "Bad/Name", "source": {"path": "/a"}}]})
