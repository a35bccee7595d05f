"""Engine flags as vLLM spells them; the rendered Deployment; hashes that restart only when needed."""

from __future__ import annotations

import json

import pytest

from oculis.upstream import GPUUpstreamSpec
from oculis_operator import engine_args, render


def spec(**kw: object) -> GPUUpstreamSpec:
    base: dict[str, object] = {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 2,
                               "gpu": {"product": "H100-80GB", "count": 2}}
    return GPUUpstreamSpec.model_validate({**base, **kw})


def test_flags_from_the_table_then_extra_args() -> None:
    s = spec(engine={"maxModelLen": 8192, "maxNumSeqs": 32, "maxNumBatchedTokens": 4096, "schedulerPolicy": "priority",
                     "kvCacheDtype": "fp8", "prefixCaching": False, "extraArgs": ["--enforce-eager"]})
    argv = engine_args.build(s, {})
    assert argv[0] == "meta-llama/Llama-3.1-8B-Instruct"
    assert argv[1:] == ["--host=0.0.0.0", "--port=8000", "--served-model-name", "meta-llama/Llama-3.1-8B-Instruct",
                        "--tensor-parallel-size=2", "--max-model-len=8192", "--max-num-seqs=32",
                        "--max-num-batched-tokens=4096", "--scheduling-policy=priority",
                        "--gpu-memory-utilization=0.92", "--kv-cache-dtype=fp8", "--no-enable-prefix-caching",
                        "--enforce-eager"]


# (--swap-space and --preemption-mode never get this far: the schema refuses them, oculis.vllm_flags.)
@pytest.mark.parametrize("flag", ["--max-num-seqs=9", "--tensor-parallel-size=4", "--max_num_seqs=9"])
def test_extra_args_may_not_repeat_typed_flags(flag: str) -> None:
    with pytest.raises(engine_args.ExtraArgError, match=r"spec.engine.extraArgs\[0\]"):
        engine_args.build(spec(engine={"extraArgs": [flag]}), {})


def test_speculative_config_json() -> None:
    draft = engine_args.build(spec(engine={"speculative": {"draftModel": "meta-llama/Llama-3.2-1B-Instruct",
                                                           "numSpeculativeTokens": 3}}), {})
    sc = next(a for a in draft if a.startswith("--speculative-config="))
    assert json.loads(sc.split("=", 1)[1]) == {"model": "meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 3}
    ngram = engine_args.build(spec(engine={"speculative": {"method": "ngram"}}), {})
    sc = next(a for a in ngram if a.startswith("--speculative-config="))
    assert json.loads(sc.split("=", 1)[1])["method"] == "ngram"


def test_deployment_shape() -> None:
    s = spec(nodeSelector={"pool": "gold"}, tolerations=[{"key": "team", "operator": "Exists"}])
    dep = render.deployment("llama", "ns", "uid-1", s, ["m"], 16 * 1024**3, {"maxSurge": 1, "maxUnavailable": 0})
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"][0] == {"key": "nvidia.com/gpu.product", "operator": "In",
                                           "values": ["NVIDIA-H100-80GB-HBM3"]}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"pool": "gold"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert c["startupProbe"]["failureThreshold"] == render.startup_failure_threshold(16 * 1024**3) == 114
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_replicas_and_strategy_do_not_change_the_hashes() -> None:
    a = render.deployment("x", "ns", "u", spec(replicas=1), ["m"], 1, {"maxSurge": 1, "maxUnavailable": 0})
    b = render.deployment("x", "ns", "u", spec(replicas=5), ["m"], 1, {"maxSurge": 0, "maxUnavailable": 1})
    c = render.deployment("x", "ns", "u", spec(replicas=1), ["m", "--x"], 1, {"maxSurge": 1, "maxUnavailable": 0})
    h = render.SPEC_HASH
    assert a["metadata"]["annotations"][h] == b["metadata"]["annotations"][h] != c["metadata"]["annotations"][h]
    eh = render.ENGINE_HASH
    assert a["spec"]["template"]["metadata"]["annotations"][eh] != c["spec"]["template"]["metadata"]["annotations"][eh]


def test_eagle_renders_its_method_with_its_head_and_needs_one() -> None:
    argv = engine_args.build(spec(engine={"speculative": {"method": "eagle3",
                                                          "draftModel": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}}), {})
    sc = json.loads(next(a for a in argv if a.startswith("--speculative-config=")).split("=", 1)[1])
    assert sc == {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 4}
    # vLLM 0.32 refuses an EAGLE method without its head; the schema says so first.
    with pytest.raises(ValueError, match="method eagle3 needs draftModel"):
        spec(engine={"speculative": {"method": "eagle3"}})
