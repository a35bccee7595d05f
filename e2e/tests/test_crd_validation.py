"""The API server itself refuses bad GPUUpstreams at apply time (schema and CEL), naming the field."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

GOOD = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": {"product": "H100-80GB", "count": 1}}


def body(spec: dict[str, Any], name: str = "x") -> dict[str, Any]:
    return {"apiVersion": "oculis.dev/v1alpha1", "kind": "GPUUpstream", "metadata": {"name": name}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "name", "expected"),
    [
        ({**GOOD, "gpu": {"product": "H100-80GB", "count": 0}}, "x", "spec.gpu.count"),
        ({**GOOD, "replicas": -1}, "x", "spec.replicas"),
        ({**GOOD, "gpu": {"product": "V100"}}, "x", 'spec.gpu.product: Unsupported value: "V100"'),
        ({**GOOD, "provider": "grpc"}, "x", "spec.provider: Unsupported value"),
        ({**GOOD, "engine": {"gpuMemoryUtilization": 0}}, "x", "spec.engine.gpuMemoryUtilization"),
        ({**GOOD, "engine": {"gpuMemoryUtilization": 1.2}}, "x", "spec.engine.gpuMemoryUtilization"),
        ({**GOOD, "engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 32}}, "x",
         "spec.engine.maxNumBatchedTokens must be >= spec.engine.maxNumSeqs"),
        ({"provider": "vllm", "model": "m"}, "x", "spec.gpu is required when provider is vllm"),
        ({"provider": "openai", "model": "gpt-4o", "gpu": {"product": "H100-80GB"}}, "x",
         "spec.gpu and spec.engine apply only to provider vllm"),
        ({**GOOD, "engine": {"preemptionMode": "swap"}}, "x", "vLLM V1 always preempts by recompute"),
        (GOOD, "n" * 53, "metadata.name must be at most 52 characters"),
        ({**GOOD, "resources": {"requests": {"cpu": "lots"}}}, "x", "spec.resources.requests.cpu"),
        ({**GOOD, "image": ""}, "x", "spec.image"),
        ({**GOOD, "engine": {"extraArgs": ["--enforce-eager", ""]}}, "x", "spec.engine.extraArgs[1]"),
        ({**GOOD, "rollout": {"strategy": "Manual", "maxSurge": 0, "maxUnavailable": 0}}, "x",
         "maxSurge and maxUnavailable cannot both be 0"),
        ({"provider": "openai", "model": "gpt-4o", "routing": {"tokenizer": "/tokenizers/gpt"}}, "x",
         "spec.routing.tokenizer applies only to provider vllm"),
        ({**GOOD, "routing": {"tokenizer": "tokenizers/llama"}}, "x",
         "spec.routing.tokenizer must be an absolute path inside the router pod"),
        ({**GOOD, "adapters": [{"name": "llama/sql", "source": {"path": "/a"}}]}, "x",
         "an adapter name has no '/': requests name an adapter as <route or upstream>/<adapter>"),
    ],
)
def test_bad_spec_is_refused_by_the_api_server(api: client.ApiClient, crds: None, namespace: str,
                                               spec: dict[str, Any], name: str, expected: str) -> None:
    custom = client.CustomObjectsApi(api)
    with pytest.raises(client.ApiException) as err:
        custom.create_namespaced_custom_object("oculis.dev", "v1alpha1", namespace, "gpuupstreams", body(spec, name),
                                               dry_run="All")
    assert err.value.status == 422
    assert expected in json.loads(err.value.body)["message"]


def test_good_spec_is_admitted(api: client.ApiClient, crds: None, namespace: str) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "oculis.dev", "v1alpha1", namespace, "gpuupstreams", body(GOOD), dry_run="All")
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        "oculis.dev", "v1alpha1", namespace, "gpuupstreams",
        body({**GOOD, "routing": {"picker": "kv-events", "tokenizer": "/tokenizers/llama-8b"}}), dry_run="All")


def test_kubectl_explain_describes_the_fields(bin_dir: Path, kubeconfig: Path, crds: None) -> None:
    def explain(field: str) -> str:
        proc = subprocess.run([str(bin_dir / "kubectl"), "explain", field], capture_output=True, text=True,
                              env={**os.environ, "KUBECONFIG": str(kubeconfig)}, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "Sequences scheduled at once" in explain("gpuupstreams.spec.engine.maxNumSeqs")
    assert "KV cache bytes one token takes" in explain("gu.status.capacity.kvBytesPerToken")
    assert "the first whose match holds answers" in explain("inferenceroutes.spec.tiers")
