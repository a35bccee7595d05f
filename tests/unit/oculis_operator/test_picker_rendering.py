"""spec.routing.picker and .tokenizer: refused on external providers (pydantic and the CRD's CEL say the
same), a relative tokenizer refused likewise, both rendered into the router config, and kv-events
renders vLLM's --kv-events-config and its port; the InferencePool the operator writes where the
Gateway API Inference Extension CRD exists."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from oculis import crdgen
from oculis.router import RouterConfig
from oculis.router_upstream import KV_EVENTS_PORT
from oculis.upstream import PICKER_EXTERNAL, TOKENIZER_EXTERNAL, TOKENIZER_RELATIVE, GPUUpstreamSpec
from oculis_operator import engine_args, render
from oculis_operator.upstream_entry import upstream_entry

VLLM: dict[str, Any] = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 3,
                        "gpu": {"product": "H100-80GB", "count": 1}}


def test_a_picker_on_an_external_provider_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"spec\.routing\.picker applies only to provider vllm"):
        GPUUpstreamSpec.model_validate({"provider": "openai", "model": "gpt-4o", "routing": {"picker": "prefix"}})
    rules = crdgen.gpuupstream_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    assert {"rule": "self.provider == 'vllm' || !has(self.routing) || !has(self.routing.picker)",
            "message": PICKER_EXTERNAL, "fieldPath": ".routing.picker"} in rules


def test_a_tokenizer_on_an_external_provider_or_relative_is_refused_naming_the_field_and_fix() -> None:
    with pytest.raises(ValidationError, match=r"spec\.routing\.tokenizer applies only to provider vllm") as err:
        GPUUpstreamSpec.model_validate({"provider": "openai", "model": "gpt-4o",
                                        "routing": {"tokenizer": "/tokenizers/gpt"}})
    assert "remove spec.routing.tokenizer" in str(err.value)
    with pytest.raises(ValidationError) as err:
        GPUUpstreamSpec.model_validate({**VLLM, "routing": {"tokenizer": "tokenizers/llama"}})
    said = next(e["msg"] for e in err.value.errors())
    assert said == f"Value error, {TOKENIZER_RELATIVE} (got 'tokenizers/llama')" and "\n" not in said
    ok = GPUUpstreamSpec.model_validate({**VLLM, "routing": {"tokenizer": "/tokenizers/llama-8b"}})
    assert ok.routing is not None and ok.routing.tokenizer == "/tokenizers/llama-8b"
    spec = crdgen.gpuupstream_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = spec["x-kubernetes-validations"]
    assert {"rule": "self.provider == 'vllm' || !has(self.routing) || !has(self.routing.tokenizer)",
            "message": TOKENIZER_EXTERNAL, "fieldPath": ".routing.tokenizer"} in rules
    assert {"rule": "!has(self.routing) || !has(self.routing.tokenizer) || self.routing.tokenizer.startsWith('/')",
            "message": TOKENIZER_RELATIVE, "fieldPath": ".routing.tokenizer"} in rules
    field = spec["properties"]["routing"]["properties"]["tokenizer"]
    assert field["type"] == "string" and field["maxLength"] == 4096 and "router.extraVolumes" in field["description"]


def test_kv_events_renders_the_publisher_and_its_port_other_pickers_do_not() -> None:
    kv = GPUUpstreamSpec.model_validate({**VLLM, "routing": {"picker": "kv-events"}})
    argv = engine_args.build(kv, {})
    flag = next(a for a in argv if a.startswith("--kv-events-config="))
    cfg = json.loads(flag.split("=", 1)[1])
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{KV_EVENTS_PORT}",
                   "topic": "kv-events"}
    ports = render.pod_template("llama", kv, argv, 0)["spec"]["containers"][0]["ports"]
    assert {"name": "kv-events", "containerPort": KV_EVENTS_PORT} in ports
    plain = GPUUpstreamSpec.model_validate({**VLLM, "routing": {"picker": "prefix"}})
    assert not any(a.startswith("--kv-events-config") for a in engine_args.build(plain, {}))
    with pytest.raises(engine_args.ExtraArgError):
        engine_args.build(GPUUpstreamSpec.model_validate({**VLLM, "engine": {"extraArgs": ["--kv-events-config={}"]}}),
                          {})


def test_the_router_config_carries_the_picker() -> None:
    obj = {"metadata": {"name": "llama", "namespace": "demo", "generation": 1},
           "spec": {**VLLM, "routing": {"picker": "least-loaded"}}, "status": {"engineHash": "abc"}}
    entry, _ = upstream_entry(obj)
    assert entry["picker"] == "least-loaded"
    assert RouterConfig.model_validate({"upstreams": [entry]}).upstreams[0].picker_name == "least-loaded"
    del obj["spec"]["routing"]
    assert "picker" not in upstream_entry(obj)[0]  # the router's default (prefix)


def test_the_router_config_carries_the_tokenizer_path_unchecked_by_the_operator() -> None:
    """The path is inside the router pod, which the operator cannot see: rendered as given, and the router
    config's own schema (absolute, self-hosted) accepts it; whether the file is there is the router's to say."""
    obj = {"metadata": {"name": "llama", "namespace": "demo", "generation": 1},
           "spec": {**VLLM, "routing": {"picker": "kv-events", "tokenizer": "/tokenizers/not-on-this-machine"}},
           "status": {"engineHash": "abc"}}
    entry, _ = upstream_entry(obj)
    assert entry["tokenizer"] == "/tokenizers/not-on-this-machine"
    assert RouterConfig.model_validate({"upstreams": [entry]}).upstreams[0].tokenizer == entry["tokenizer"]
    obj["spec"]["routing"] = {"picker": "prefix"}
    assert "tokenizer" not in upstream_entry(obj)[0]  # the prompt's text is hashed, as before


def test_the_inference_pool_selects_the_stable_engine_pods_on_their_port() -> None:
    pool = render.inference_pool("llama", "demo", "uid-1")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1" and pool["kind"] == "InferencePool"
    assert pool["spec"] == {"selector": {"matchLabels": {"oculis.dev/upstream": "llama",
                                                         "app.kubernetes.io/name": "vllm"}},
                            "targetPorts": [{"number": engine_args.PORT}]}
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert pool["spec"]["selector"]["matchLabels"] == render.service("llama", "demo", "u")["spec"]["selector"]


class _Custom:
    def __init__(self, status: int | None) -> None:
        self.status, self.created, self.patched = status, 0, 0

    def create_namespaced_custom_object(self, *args: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        self.created += 1
        if self.status is not None:
            raise ApiException(status=self.status)

    def patch_namespaced_custom_object(self, *args: Any, **kw: Any) -> None:
        self.patched += 1


def test_the_inference_pool_is_skipped_cleanly_without_its_crd_and_written_once_with_it() -> None:
    from oculis_operator.kube import Kube

    kube = Kube.__new__(Kube)
    kube.requests, kube.on_request, kube.pools_applied, kube.no_pool_crd_until = 0, None, {}, 0.0
    kube.custom = _Custom(404)  # type: ignore[assignment]
    body = render.inference_pool("llama", "demo", "uid-1")
    assert kube.apply_inference_pool(body, 100.0) == "absent"
    assert kube.apply_inference_pool(body, 200.0) == "absent" and kube.custom.created == 1  # not asked again
    kube.custom = _Custom(None)  # type: ignore[assignment]
    assert kube.apply_inference_pool(body, 500.0) == "applied"  # the CRD was installed meanwhile
    assert kube.apply_inference_pool(body, 501.0) == "unchanged" and kube.custom.created == 1
    kube.pools_applied.clear()
    kube.custom = _Custom(409)  # type: ignore[assignment]
    assert kube.apply_inference_pool(body, 600.0) == "applied" and kube.custom.patched == 1  # existed: patched


def test_kv_events_condition_says_when_the_router_hears_no_events_and_ready_is_untouched() -> None:
    from oculis_operator.reconcile import reconcile
    from oculis_operator.reconcile_io import Observed

    spec = {**VLLM, "replicas": 1, "routing": {"picker": "kv-events"}}
    dep = reconcile(Observed("x", "ns", "uid", 1, spec, {}, None), lambda p: 8, "t").create[0]
    dep["metadata"]["generation"] = 1
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1,
                     "availableReplicas": 1}

    def conds(silent: float | None) -> tuple[dict[str, dict[str, Any]], list[tuple[str, str]]]:
        out = reconcile(Observed("x", "ns", "uid", 1, spec, {}, dep, kv_events_silent=silent), lambda p: 8, "t")
        return {c["type"]: c for c in out.status["conditions"]}, out.warnings

    silent, warnings = conds(2)
    assert silent["KVEvents"]["status"] == "False" and silent["KVEvents"]["reason"] == "NoEvents"
    assert "2 replica(s) publish no KV events" in silent["KVEvents"]["message"]
    assert ("KVEventsFallback", silent["KVEvents"]["message"]) in warnings
    assert silent["Ready"]["status"] == "True"  # requests still flow (prefix fallback)
    heard, _ = conds(0)
    assert heard["KVEvents"]["status"] == "True"
    assert "KVEvents" not in conds(None)[0]  # not read (no Prometheus): nothing said
