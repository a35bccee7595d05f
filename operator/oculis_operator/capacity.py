"""Will this engine configuration fit its GPUs? The KV-cache capacity check, as a pure function.

Follows how vLLM V1 sizes its KV cache (../shared/notes/vllm-engine.md section 2):
    requested    = total GPU memory x gpuMemoryUtilization
    available_kv = requested - weights/TP - activation peak - non-torch - CUDA-graph estimate
    bytes/token  = 2 x layers x max(1, kv_heads // TP) x head_dim x dtype   (MLA: layers x latent x dtype, not split)
The overhead terms are estimates; vLLM's own `Available KV cache memory` log line is the truth after
a rollout. Two refusals, both ERR_OCULIS_KV_CACHE_EXHAUSTED: one `maxModelLen` sequence (or the
weights) cannot fit; or `maxNumSeqs` sequences of the planned size exceed the cache (a preemption
storm: vLLM would keep evicting and recomputing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from oculis.gpus import GPUProduct
from oculis.upstream import Engine, ModelConfig, Traffic

GiB = 1024**3
BLOCK = 16  # vLLM's default KV block size in tokens
KV_EXHAUSTED = "ERR_OCULIS_KV_CACHE_EXHAUSTED"
TOKENIZER_MISMATCH = "ERR_OCULIS_TOKENIZER_MISMATCH"
TP_MISMATCH = "ERR_OCULIS_TENSOR_PARALLEL_HEADS"
UNKNOWN_MODEL = "ERR_OCULIS_UNKNOWN_MODEL"

# Engine defaults per traffic profile (used where `engine` leaves a field unset), and the tokens per
# sequence the check plans for.
PROFILES: dict[str, dict[str, int]] = {
    # short prefill chunks keep inter-token latency low
    "interactive": {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "prompt": 1024, "output": 256},
    # long prompts: larger chunks prefill them in fewer steps
    "rag": {"max_num_seqs": 64, "max_num_batched_tokens": 8192, "prompt": 4096, "output": 512},
    # throughput first
    "batch": {"max_num_seqs": 256, "max_num_batched_tokens": 16384, "prompt": 2048, "output": 1024},
}
QUANT_BYTES = {"fp8": 1.0, "awq": 0.5, "gptq": 0.5, "compressed-tensors": 1.0}
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 24  # dummy-batch peak per scheduled token, per hidden unit (estimate)
NON_TORCH = int(0.5 * GiB)  # cuBLAS/NCCL buffers; more with tensor parallelism
CUDA_GRAPHS = 1 * GiB  # vLLM >= 0.20 reserves its CUDA-graph estimate by default


@dataclass(frozen=True)
class Plan:
    fits: bool
    error_code: str | None
    message: str
    gpu_memory_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_budget_bytes: int
    kv_cache_tokens: int
    max_concurrency: int
    tokens_per_seq: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    safe_max_num_seqs: int
    safe_max_model_len: int
    refuse_at_admission: bool  # one sequence or the weights cannot fit: rejectable at apply time

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def kv_bytes_per_token(model: ModelConfig, tp: int, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token costs on each GPU."""
    dtype = 1 if kv_cache_dtype == "fp8" else 2  # auto = the compute dtype (bf16/fp16)
    if model.mla_latent_dim:  # MLA keeps one latent per layer on every rank
        return model.num_layers * model.mla_latent_dim * dtype
    return 2 * model.num_layers * max(1, model.num_kv_heads // tp) * model.head_dim * dtype


def weights_bytes_per_gpu(model: ModelConfig, tp: int, quantization: str | None = None) -> int:
    per_param = QUANT_BYTES.get(quantization or "", model.dtype_bytes)
    return round(model.params_billions * 1e9 * per_param / tp)


def resolve_engine(engine: Engine | None, traffic: Traffic | None, model: ModelConfig) -> tuple[int, int, int, int]:
    """(max_model_len, max_num_seqs, max_num_batched_tokens, tokens_per_seq) with profile defaults."""
    engine = engine or Engine()
    traffic = traffic or Traffic()
    prof = PROFILES[traffic.profile]
    max_len = engine.max_model_len or model.max_position_embeddings
    seqs = engine.max_num_seqs or prof["max_num_seqs"]
    batched = engine.max_num_batched_tokens or max(prof["max_num_batched_tokens"], seqs)
    per_seq = (traffic.avg_prompt_tokens or prof["prompt"]) + (traffic.avg_output_tokens or prof["output"])
    return max_len, seqs, batched, min(per_seq, max_len)


def plan(model: ModelConfig, gpu: GPUProduct, tp: int, engine: Engine | None = None,
         traffic: Traffic | None = None, draft: ModelConfig | None = None, model_name: str = "model") -> Plan:
    e = engine or Engine()
    max_len, seqs, batched, per_seq = resolve_engine(engine, traffic, model)
    total = gpu.memory_bytes
    kv_tok = kv_bytes_per_token(model, tp, e.kv_cache_dtype)
    weights = weights_bytes_per_gpu(model, tp, e.quantization)
    spec = e.speculative if e.speculative and e.speculative.enabled else None
    if draft is not None and spec is not None:
        kv_tok += kv_bytes_per_token(draft, tp, e.kv_cache_dtype)
        weights += weights_bytes_per_gpu(draft, tp)
    elif spec is not None and spec.method == "mtp":  # one extra decoder layer of the target
        kv_tok += kv_bytes_per_token(model, tp, e.kv_cache_dtype) // model.num_layers
    usable = int(total * e.gpu_memory_utilization)

    def overhead_and_budget(n_seqs: int, n_batched: int) -> tuple[int, int]:
        """(runtime overhead, KV budget) in bytes for a batch of n_seqs sequences and n_batched tokens a step."""
        activation = (n_batched * model.hidden_size * ACTIVATION_BYTES_PER_TOKEN_HIDDEN // tp
                      + n_seqs * model.vocab_size * 4)
        overhead = activation + NON_TORCH * (2 if tp > 1 else 1) + CUDA_GRAPHS
        return overhead, usable - weights - overhead

    overhead, budget = overhead_and_budget(seqs, batched)
    tokens = max(0, budget // kv_tok // BLOCK * BLOCK)
    base: dict[str, Any] = dict(
        gpu_memory_bytes=total, weights_bytes_per_gpu=weights, kv_bytes_per_token=kv_tok, kv_budget_bytes=budget,
        kv_cache_tokens=tokens, max_concurrency=tokens // per_seq if per_seq else 0, tokens_per_seq=per_seq,
        max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
        safe_max_num_seqs=tokens // per_seq if per_seq else 0,
        safe_max_model_len=min(tokens, model.max_position_embeddings),
    )
    where = (f"{model_name} on {gpu.key} x{tp}, gpuMemoryUtilization {e.gpu_memory_utilization}: weights "
             f"{weights / GiB:.2f} GiB/GPU, overhead ~{overhead / GiB:.2f} GiB, KV {kv_tok} bytes/token/GPU")
    if model.num_attention_heads % tp:
        return Plan(False, TP_MISMATCH, f"{TP_MISMATCH}: gpu.count {tp} (tensor-parallel size) must divide the "
                    f"model's {model.num_attention_heads} attention heads, as vLLM requires; use a divisor",
                    refuse_at_admission=True, **base)
    if budget <= 0:
        # The activation peak grows with maxNumSeqs (and maxNumBatchedTokens): when the weights fit, a
        # smaller batch is the fix, not more or larger GPUs.
        profile = (traffic or Traffic()).profile
        prof_batched = PROFILES[profile]["max_num_batched_tokens"]

        def fits_with(n: int) -> bool:
            left = overhead_and_budget(n, e.max_num_batched_tokens or max(prof_batched, n))[1]
            n_tokens = max(0, left // kv_tok // BLOCK * BLOCK)
            return n_tokens >= max_len and n * per_seq <= n_tokens

        safe = largest_true(fits_with, seqs)
        base["safe_max_num_seqs"] = safe
        if safe:
            fix = f"lower maxNumSeqs to at most {safe} (the largest safe maxNumSeqs)"
        elif e.max_num_batched_tokens and overhead_and_budget(1, prof_batched)[1] > 0:
            fix = f"lower maxNumBatchedTokens (the {profile} profile uses {prof_batched})"
        else:
            fix = "raise gpu.count, quantize, or use a larger GPU"
        return Plan(False, KV_EXHAUSTED, f"{KV_EXHAUSTED}: the weights and runtime overhead do not fit: {where}, "
                    f"{usable / GiB:.2f} GiB usable; {fix}", refuse_at_admission=True, **base)
    if tokens < max_len:
        return Plan(False, KV_EXHAUSTED, f"{KV_EXHAUSTED}: one sequence of maxModelLen {max_len} needs {max_len} "
                    f"KV tokens but the cache holds {tokens} ({where}); largest safe maxModelLen is "
                    f"{base['safe_max_model_len']}, "
                    f"largest safe maxNumSeqs is {base['safe_max_num_seqs']}", refuse_at_admission=True, **base)
    if seqs * per_seq > tokens:
        return Plan(False, KV_EXHAUSTED, f"{KV_EXHAUSTED}: maxNumSeqs {seqs} x {per_seq} planned tokens per "
                    f"sequence = {seqs * per_seq} exceeds the KV cache of {tokens} tokens ({where}): a preemption "
                    f"storm; largest safe maxNumSeqs is {base['safe_max_num_seqs']}, largest safe maxModelLen is "
                    f"{base['safe_max_model_len']}", refuse_at_admission=False, **base)
    return Plan(True, None, f"fits: {tokens} KV tokens hold {base['max_concurrency']} sequences of {per_seq} "
                f"tokens ({where})", refuse_at_admission=False, **base)


def largest_true(ok: Callable[[int], bool], upper: int) -> int:
    """The largest n in [1, upper] with ok(n), for an ok that holds up to some n and fails above; 0 if none."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def draft_mismatch(target: ModelConfig, draft: ModelConfig, target_name: str, draft_name: str) -> str | None:
    """vLLM's draft model uses the target's tokenizer: vocabularies must match."""
    if target.vocab_size == draft.vocab_size:
        return None
    return (f"{TOKENIZER_MISMATCH}: draft model {draft_name} has a vocabulary of {draft.vocab_size} tokens but "
            f"{target_name} has {target.vocab_size}; vLLM's draft model shares the target's tokenizer, so pick a "
            "draft of the same family (same tokenizer) or use speculative.method: ngram")
