"""Every `vllm serve` argv the operator renders is one real vLLM accepts: the examples' GPUUpstreams and a
hypothesis sample of valid ones, rendered by the operator's own code (the capacity plan's resolved values,
then engine_args.build) and judged by vLLM's own parser (make_arg_parser, validate_parsed_serve_args), a
few also by its engine config (create_engine_config, on the tiny model). And the flags a vLLM version no
longer has (oculis.vllm_flags) are exactly ones that version's parser refuses, and Oculis refuses them
first, at validation, naming the field and the version."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import realvllm
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from oculis.upstream import GPUUpstreamSpec
from oculis.vllm_flags import REMOVED_FLAGS, vllm_version
from oculis_operator import capacity, engine_args, reconcile

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REAL_IMAGE = "vllm/vllm-openai:v0.32.0"  # the version the tier installs (realvllm.VLLM_VERSION)


def rendered(name: str, spec: GPUUpstreamSpec) -> list[str] | None:
    """The argv the reconcile would write for `spec`, or None when it would refuse the spec."""
    plan = reconcile.check(spec)
    if not isinstance(plan, capacity.Plan) or not plan.fits:
        return None
    resolved = {"max_model_len": plan.max_model_len, "max_num_seqs": plan.max_num_seqs,
                "max_num_batched_tokens": plan.max_num_batched_tokens}
    try:
        return engine_args.build(spec, resolved, alias=name)
    except engine_args.ExtraArgError:
        return None


def real_verdicts(venv: Path, tmp: Path, argvs: list[list[str]], deep: list[list[str]] = ()) -> list[dict[str, Any]]:
    out = tmp / "verdicts.json"
    proc = subprocess.run([str(venv / "bin" / "python"), str(HERE / "vllm_argcheck.py"), str(out)],
                          input=json.dumps({"argvs": argvs, "deep": list(deep)}), text=True, capture_output=True,
                          timeout=900, env=realvllm.engine_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts: list[dict[str, Any]] = json.loads(out.read_text())
    return verdicts


_models = st.sampled_from(["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct",
                           "Qwen/Qwen3-8B", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-30B-A3B", "openai/gpt-oss-20b"])
_speculative = st.one_of(
    st.none(),
    st.fixed_dictionaries({"method": st.just("ngram"), "numSpeculativeTokens": st.integers(1, 8)}),
    st.fixed_dictionaries({"draftModel": st.just("meta-llama/Llama-3.2-1B-Instruct"),
                           "numSpeculativeTokens": st.integers(1, 6)}),
    st.fixed_dictionaries({"method": st.sampled_from(["eagle", "eagle3", "mtp"]), "enabled": st.booleans()}),
    st.fixed_dictionaries({"method": st.just("eagle3"), "draftModel": st.just("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B")}),
)
_extra = st.lists(st.sampled_from(["--enforce-eager", "--enable-chunked-prefill", "--block-size=16",
                                   "--disable-log-stats", "--trust-remote-code", "--seed=0"]),
                  max_size=2, unique=True)
_engine = st.fixed_dictionaries({}, optional={
    "maxModelLen": st.sampled_from([2048, 4096, 8192, 32768]),
    "maxNumSeqs": st.sampled_from([1, 8, 64, 256]),
    "maxNumBatchedTokens": st.sampled_from([2048, 8192, 16384]),
    "schedulerPolicy": st.sampled_from(["fcfs", "priority"]),
    "preemptionMode": st.just("recompute"),
    "gpuMemoryUtilization": st.sampled_from([0.5, 0.85, 0.92, 0.95]),
    "kvCacheDtype": st.sampled_from(["auto", "fp8"]),
    "quantization": st.sampled_from(["fp8", "awq", "gptq", "compressed-tensors"]),
    "prefixCaching": st.booleans(),
    "speculative": _speculative,
    "extraArgs": _extra,
})
_spec = st.fixed_dictionaries({
    "provider": st.just("vllm"), "model": _models, "engine": _engine,
    "gpu": st.fixed_dictionaries({"product": st.sampled_from(["H100-80GB", "A100-80GB", "H200-141GB", "L40S-48GB"]),
                                  "count": st.sampled_from([1, 2, 4, 8])}),
    "image": st.sampled_from([REAL_IMAGE, "vllm/vllm-openai:v0.20.0"]),
})


LORA_SPECS: list[dict[str, Any]] = [
    {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "gpu": {"product": "H100-80GB"},
     "engine": {"maxLoras": 4, "maxLoraRank": 64, "extraArgs": ["--max-cpu-loras=8"],
                "runtimeLoraUpdating": False},  # False: --lora-modules rendered, checked by the parser
     "adapters": [{"name": "sql", "source": {"huggingFace": "org/sql-lora"}, "rank": 64},
                  {"name": "style", "source": {"pvc": {"name": "loras", "subPath": "style"}}}]},
    {"provider": "vllm", "model": "Qwen/Qwen3-8B", "gpu": {"product": "H100-80GB", "count": 2},
     "adapters": [{"name": "one", "source": {"path": "/models/one"}}]},
]


def sample_argvs() -> list[tuple[str, list[str]]]:
    """(where it came from, argv) for the examples and a deterministic hypothesis sample."""
    found: list[tuple[str, list[str]]] = []
    for doc in yaml.safe_load_all((REPO / "examples" / "gpuupstream-llama-8b.yaml").read_text()):
        spec = GPUUpstreamSpec.model_validate(doc["spec"])
        if spec.self_hosted and (argv := rendered(doc["metadata"]["name"], spec)):
            found.append((f"examples: {doc['metadata']['name']}", argv))

    for body in LORA_SPECS:  # LoRA; --lora-modules only where runtime loading is off
        if argv := rendered("lora", GPUUpstreamSpec.model_validate(body)):
            found.append((json.dumps(body, sort_keys=True), argv))

    @settings(max_examples=80, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=_spec)
    def draw(body: dict[str, Any]) -> None:
        try:
            spec = GPUUpstreamSpec.model_validate(body)
        except ValidationError:
            return
        if argv := rendered("sampled", spec):
            found.append((json.dumps(body, sort_keys=True), argv))

    draw()
    return found


def test_every_rendered_argv_is_accepted_by_real_vllms_parser(vllm_venv: Path, tmp_path: Path) -> None:
    samples = sample_argvs()
    assert len(samples) >= 30, "the sample should render many argvs"
    verdicts = real_verdicts(vllm_venv, tmp_path, [argv for _, argv in samples])
    refused = [(where, argv, v["error"]) for (where, argv), v in zip(samples, verdicts, strict=True) if not v["ok"]]
    assert not refused, "\n".join(f"{w}\n  {' '.join(a)}\n  -> {e}" for w, a, e in refused[:5])


def _on_tiny_model(argv: list[str], model: Path) -> list[str]:
    """The same flags on the tiny model, as one CPU can host it: TP 1, no weight quantization, its context."""
    out = [str(model)]
    for arg in argv[1:]:
        flag = arg.split("=", 1)[0]
        if flag in ("--tensor-parallel-size", "--quantization", "--max-model-len", "--max-num-batched-tokens"):
            continue
        if flag == "--speculative-config" and '"ngram"' not in arg:
            continue  # a draft model, EAGLE head or MTP layers from the hub: the tier is offline
        out.append(arg)
    return [*out, "--tensor-parallel-size=1", "--max-model-len=512", "--max-num-batched-tokens=2048"]


def test_a_few_rendered_argvs_build_a_real_engine_config(vllm_venv: Path, tiny_model: Path, tmp_path: Path) -> None:
    samples = [argv for _, argv in sample_argvs()]
    picks = [samples[0]]  # the example
    picks += [a for a in samples if any(x.startswith("--speculative-config=") and "ngram" in x for x in a)][:1]
    picks += [a for a in samples if "--kv-cache-dtype=fp8" in a and "--scheduling-policy=priority" in a][:1]
    picks += [a for a in samples if "--no-enable-prefix-caching" in a][:1]
    deep = [_on_tiny_model(a, tiny_model) for a in picks]
    verdicts = real_verdicts(vllm_venv, tmp_path, [], deep)
    bad = [f"{' '.join(a)}\n  -> {v['error']}" for a, v in zip(deep, verdicts, strict=True) if not v["ok"]]
    assert not bad, "\n".join(bad)


def test_removed_flags_are_refused_by_that_vllm_and_by_oculis_first(vllm_venv: Path, tmp_path: Path) -> None:
    base = ["m", "--max-model-len=512"]
    flags = {"--preemption-mode": "--preemption-mode=recompute", "--swap-space": "--swap-space=4",
             "--disable-log-requests": "--disable-log-requests", "--num-scheduler-steps": "--num-scheduler-steps=8",
             "--use-v2-block-manager": "--use-v2-block-manager"}
    assert set(flags) == set(REMOVED_FLAGS)
    real = vllm_version(REAL_IMAGE)
    assert real is not None
    gone = [f for f, (since, _) in REMOVED_FLAGS.items() if real >= since]
    verdicts = real_verdicts(vllm_venv, tmp_path, [base, *[[*base, flags[f]] for f in gone]])
    assert verdicts[0]["ok"], verdicts[0]
    for flag, verdict in zip(gone, verdicts[1:], strict=True):
        assert not verdict["ok"] and "unrecognized arguments" in verdict["error"], (flag, verdict)
        body = {"provider": "vllm", "model": "Qwen/Qwen3-8B", "gpu": {"product": "H100-80GB"}, "image": REAL_IMAGE,
                "engine": {"extraArgs": [flags[flag]]}}
        with pytest.raises(ValidationError, match=rf"engine.extraArgs\[0\]: {flag} does not exist in vLLM 0.32"):
            GPUUpstreamSpec.model_validate(body)
