"""A property of the one schema, checked by hypothesis against the real API server: every GPUUpstream
spec the schema accepts (the pydantic model and the CRD as the API server applies it, webhook
included) renders a Deployment the API server accepts (server-side dry run), and every refusal
names the field it refuses. The fields drawn are the ones copied into the pod template as they are
(annotations, node selector, tolerations, resources, image, replicas), over both well-formed and
ill-formed values."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from kubernetes import client
from pydantic import ValidationError

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import engine_args, render

G, V, P = "oculis.dev", "v1alpha1", "gpuupstreams"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"

# Names and values near the edges of Kubernetes' syntax: DNS prefixes, dots, dashes, underscores,
# spaces, slashes, upper case, empty and over-long parts.
_piece = st.text(alphabet="abcXYZ019-_./ ", min_size=0, max_size=12)
_key = st.one_of(_piece, st.builds(lambda a, b: f"{a}/{b}", _piece, _piece), st.just("a" * 70),
                 st.sampled_from(["app", "example.com/team", "oculis.dev/e2e-ready-delay", "kubernetes.io/x"]))
_value = st.one_of(_piece, st.just("v" * 70), st.sampled_from(["", "ok", "a-b_c.d"]))
_quantity = st.one_of(st.sampled_from(["8", "500m", "64Gi", "1.5", "1e3", "1.2.3", "-1", "++1", "1Gi5", "..",
                                       "0", "1E", "2Ki", "3i"]), st.from_regex(r"[0-9.]{1,4}[eEinumkKMGTP]{0,2}",
                                                                              fullmatch=True))
_toleration = st.fixed_dictionaries({}, optional={
    "key": _key, "operator": st.sampled_from(["Exists", "Equal"]), "value": _value,
    "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])})
_spec = st.fixed_dictionaries({}, optional={
    "podAnnotations": st.dictionaries(_key, _value, max_size=3),
    "nodeSelector": st.dictionaries(_key, _value, max_size=3),
    "tolerations": st.lists(_toleration, max_size=2),
    "resources": st.fixed_dictionaries({}, optional={
        "requests": st.fixed_dictionaries({}, optional={"cpu": _quantity, "memory": _quantity}),
        "limits": st.fixed_dictionaries({}, optional={"cpu": _quantity, "memory": _quantity})}),
    "image": st.one_of(st.sampled_from(["vllm/vllm-openai:v0.20.0", "registry.local:5000/vllm:v0.19.1"]), _piece),
    "replicas": st.integers(-1, 1001),
})


def _base(extra: dict[str, Any]) -> dict[str, Any]:
    return {"provider": "vllm", "model": LLAMA_8B, "gpu": {"product": "H100-80GB", "count": 1},
            "engine": {"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 8192}, **extra}


def _names_a_field(message: str, extra: dict[str, Any]) -> bool:
    return any(re.search(rf"\b{re.escape(f)}\b", message) for f in (*extra, "spec"))


@pytest.fixture(scope="module")
def dry(api: client.ApiClient, operator: Any) -> Any:
    core = client.CoreV1Api(api)
    ns = "oculis-dry-run"
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    except client.ApiException as exc:
        if exc.status != 409:
            raise
    return client.CustomObjectsApi(api), client.AppsV1Api(api), ns


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None)
@given(extra=_spec)
# What it found, kept as examples: each passed the schema and its Deployment was refused.
@example(extra={"resources": {"requests": {"cpu": "1.2.3"}}})  # matches the API server's quoted regex only
@example(extra={"tolerations": [{}]})  # no key and no operator: Equal with an empty key
@example(extra={"tolerations": [{"operator": "Exists", "value": "x"}]})
@example(extra={"podAnnotations": {"a b": "x"}})
@example(extra={"nodeSelector": {"app": "a b"}})
@example(extra={"image": "vllm x"})
@example(extra={"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}})
def test_every_accepted_spec_renders_a_deployment_the_api_server_accepts(dry: Any, extra: dict[str, Any]) -> None:
    custom, apps, ns = dry
    raw = _base(extra)
    try:
        spec = GPUUpstreamSpec.model_validate(raw)
        refusal = None
    except ValidationError as exc:
        spec, refusal = None, exc
    body = {"apiVersion": f"{G}/{V}", "kind": "GPUUpstream", "metadata": {"name": "dry"}, "spec": raw}
    try:
        custom.create_namespaced_custom_object(G, V, ns, P, body, dry_run="All")
        api_refusal = None
    except client.ApiException as exc:
        if exc.status not in (400, 422):
            raise
        api_refusal = exc.body if isinstance(exc.body, str) else str(exc.body)
    if refusal is not None:
        for err in refusal.errors():  # each refusal names its field
            assert err["loc"], f"a refusal without a field: {err}"
        continue_ok = False
    else:
        continue_ok = True
    if api_refusal is not None:
        assert _names_a_field(api_refusal, extra), f"the API server's refusal names no field: {api_refusal[:500]}"
    if not (continue_ok and api_refusal is None):
        # The schema as Python reads it and as the API server applies it must agree.
        event("refused by both")
        assert refusal is not None and api_refusal is not None, (
            f"pydantic {'refused' if refusal else 'accepted'} and the API server "
            f"{'refused' if api_refusal else 'accepted'} {extra}: {refusal or api_refusal}")
        return
    assert spec is not None
    resolved = {"max_model_len": 8192, "max_num_seqs": 32, "max_num_batched_tokens": 8192}
    argv = engine_args.build(spec, resolved, alias="dry")
    dep = render.deployment("dry", ns, "00000000-0000-0000-0000-000000000001", spec, argv, 16 << 30,
                            {"maxSurge": 1, "maxUnavailable": 0})
    event("accepted: Deployment dry-run")
    try:
        apps.create_namespaced_deployment(ns, dep, dry_run="All")
    except client.ApiException as exc:
        raise AssertionError(f"the schema accepted {extra} but its Deployment was refused: {exc.body}") from None
