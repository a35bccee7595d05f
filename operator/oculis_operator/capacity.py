"""Will this engine configuration fit its GPUs? The KV-cache capacity check, as a pure function.

Follows how vLLM V1 sizes its KV cache (../shared/notes/vllm-engine.md section 2), with the terms
checked against real start-up logs (../shared/notes/kv-observed.md):
    requested    = torch's total device memory x gpuMemoryUtilization
    available_kv = requested - weights - activation peak - non-torch [- CUDA-graph estimate, >= 0.21]
    weights      = linear layers at the checkpoint's bytes per weight / TP + embeddings and lm_head at 16 bit / TP
    activation   = the larger of the dummy forward pass and the dummy sampler run over min(maxNumSeqs,
                   maxNumBatchedTokens) rows of full-vocabulary fp32 logits (the sampler dominates dense models)
    bytes/token  = 2 x layers x max(1, kv_heads // TP) x head_dim x dtype   (MLA: layers x latent x dtype, not split)
    sliding-window layers: vLLM's KV groups (one shared block pool; tokens = concurrency x maxModelLen)
The overhead terms depend on the vLLM version (taken from the engine image tag) and on TP. vLLM's own
`Available KV cache memory` log line is the truth after a rollout. Two refusals, both
ERR_OCULIS_KV_CACHE_EXHAUSTED: one `maxModelLen` sequence (or the weights) cannot fit; or `maxNumSeqs`
sequences of the planned size exceed the cache (a preemption storm: vLLM would keep evicting and recomputing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from oculis.engine import Engine, ModelConfig, Traffic
from oculis.gpus import GPUProduct
from oculis.vllm_flags import PINNED_VLLM
from oculis.vllm_flags import vllm_version as vllm_version  # the plan's version comes from the image tag
from oculis_operator import lora_capacity

GiB = 1024**3
BLOCK = 16  # vLLM's default KV block size in tokens
MLA_BLOCK = 64  # FlashMLA, vLLM's MLA backend on Hopper, needs 64-token blocks
VOCAB_PADDING = 64  # vLLM pads embedding and lm_head rows to a multiple of 64
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
# Bytes per weight of the linear layers for `engine.quantization` (vLLM's --quantization names).
# compressed-tensors covers 8- and 4-bit checkpoints; modelConfig.quantization says which.
_GROUP4 = 0.5 + 2.5 / 128  # 4-bit weights + an fp16 scale and a 4-bit zero per group of 128
QUANT_BYTES = {"fp8": 1.0, "awq": _GROUP4, "gptq": _GROUP4, "compressed-tensors": 1.0}
# Bytes per weight of the linear layers for modelConfig.quantization (the checkpoint's format).
WEIGHT_BYTES = {"fp8": 1.0, "int8": 1.0, "awq": _GROUP4, "gptq": _GROUP4,
                "w4a16": 0.5 + 2 / 128,  # compressed-tensors pack-quantized: 4 bits + a 16-bit scale per 128
                "nvfp4": 0.5 + 1 / 16,  # 4 bits + an fp8 scale per 16
                "mxfp4": 0.5 + 1 / 32}  # 4 bits + an e8m0 scale per 32

# The vLLM version the plan assumes when the image tag says none: the pinned engine image's.
DEFAULT_VLLM = PINNED_VLLM
# Dummy-sampler peak in units of one fp32 logits matrix (rows x vocabulary x 4 B), net of the kept hidden
# states. Derived from logged `torch peak memory increase`: 0.11 gives 9.57 (Llama-3.1-8B 4.76 GiB),
# 9.56 (Qwen3-0.6B 5.56 GiB), 9.57 (gpt-oss-20b 7.38 GiB) and 9.64 (Llama-3.3-70B-FP8 TP2 4.84 GiB)
# (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md); 0.19 gives 3.73 (worked case
# C01, 1.89 GiB). A dense 14B model's 5.6 -> 2.2 GiB between 0.16 and 0.17 (kv-observed pattern 2) is
# 9.5 -> 3.7 units: the same two constants.
SAMPLER_UNITS_OLD, SAMPLER_UNITS = 9.6, 3.73
SAMPLER_DROP = (0, 17)
# Non-torch memory that grows during the profiled forward pass (cuBLAS workspaces; NCCL and custom
# all-reduce buffers with TP >= 2). 0.19: 0.25 GiB at TP1, +1.8-2.1 GiB per GPU at TP >= 2 (kv-observed
# pattern 2; the 0.16-0.19 logs over-promised by that much at TP >= 2). 0.11: 0.13 / 0.55 GiB
# (llm-d-benchmark, above).
NON_TORCH_TP1, NON_TORCH_TP = int(0.25 * GiB), int(2.2 * GiB)
NON_TORCH_TP1_OLD, NON_TORCH_TP_OLD = int(0.13 * GiB), int(0.55 * GiB)
NON_TORCH_GROWTH = (0, 16)
# From 0.21 vLLM subtracts its CUDA-graph estimate from the budget by default ("CUDA graph memory
# profiling is enabled (default since v0.21.0)", LMCache/LMCache#3430); before, the graph pool sits
# outside the budget. Estimate per decoder layer: C01 estimated 0.84 GiB for 32 layers.
CUDA_GRAPHS_FROM = (0, 21)
CUDA_GRAPH_PER_LAYER = int(0.84 * GiB / 32)


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
    # How the budget splits, per GPU (bytes), and what the plan assumed.
    requested_bytes: int = 0
    activation_bytes: int = 0
    non_torch_bytes: int = 0
    cuda_graph_bytes: int = 0
    vllm_version: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    kv_blocks: int = 0  # blocks in vLLM's pool: what vllm:cache_config_info reports as num_gpu_blocks
    lora_weights_bytes: int = 0  # --enable-lora: the adapter slots, counted in weights_bytes_per_gpu
    lora_shrink_bytes: int = 0  # --enable-lora: the shrink buffer at a full step, counted in activation_bytes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def vllm_defaults(gpu: GPUProduct, version: tuple[int, int] = DEFAULT_VLLM) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM's OpenAI server picks on this device (vllm-engine 1.1)."""
    total = gpu.torch_total_bytes
    if version >= (0, 33) and total >= 160 * GiB:
        return 1024, 16384
    if total >= 70 * GiB and "a100" not in gpu.gfd_product.lower():
        return 1024, 8192
    return 256, 2048


def _kv_dtype_bytes(model: ModelConfig, kv_cache_dtype: str) -> int:
    if kv_cache_dtype.startswith("fp8"):
        return 1
    # auto = the compute dtype: bf16/fp16 (an fp8 checkpoint computes in bf16), fp32 for a 4-byte checkpoint
    return 4 if model.dtype_bytes == 4 else 2


def kv_bytes_per_layer(model: ModelConfig, tp: int, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token costs in one attention layer on each GPU."""
    dtype = _kv_dtype_bytes(model, kv_cache_dtype)
    if model.mla_latent_dim:  # MLA keeps one latent per layer on every rank
        return model.mla_latent_dim * dtype
    return 2 * max(1, model.num_kv_heads // tp) * model.head_dim * dtype


def kv_bytes_per_token(model: ModelConfig, tp: int, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token costs on each GPU (every layer as full attention)."""
    return model.num_layers * kv_bytes_per_layer(model, tp, kv_cache_dtype)


def weight_bytes_per_param(model: ModelConfig, quantization: str | None = None) -> float:
    """Bytes per weight of the linear layers: the checkpoint's format, else the engine's --quantization."""
    if model.quantization:
        return WEIGHT_BYTES[model.quantization]
    if quantization:
        return QUANT_BYTES.get(quantization, float(model.dtype_bytes))
    return float(model.dtype_bytes)


def weights_bytes_per_gpu(model: ModelConfig, tp: int, quantization: str | None = None) -> int:
    """What vLLM's `Model loading took X GiB` reports on each GPU. Quantization covers the linear layers
    (experts included); the embeddings and lm_head stay 16-bit in vLLM (VocabParallelEmbedding and
    ParallelLMHead are not quantized); all are split by TP. The rotary cos/sin cache is replicated."""
    vocab = math.ceil(model.vocab_size / VOCAB_PADDING) * VOCAB_PADDING
    vocab_matrices = 1 if model.tie_word_embeddings else 2
    params = model.params_billions * 1e9
    linear = max(0.0, params - vocab_matrices * model.vocab_size * model.hidden_size)
    per_param = weight_bytes_per_param(model, quantization)
    if per_param == 2 or per_param == 4:  # unquantized: every weight at the checkpoint dtype
        embeddings = vocab_matrices * vocab * model.hidden_size * per_param
    else:
        embeddings = vocab_matrices * vocab * model.hidden_size * 2
    rope = model.max_position_embeddings * model.head_dim * 2  # cos/sin cache in the compute dtype
    if model.quantization == "mxfp4" and model.num_experts and model.moe_intermediate_size:
        # MXFP4 checkpoints (gpt-oss) quantize only the experts; attention stays 16-bit. vLLM's MXFP4 MoE
        # kernels pad the expert width to a multiple of 256 (?): gpt-oss-20b then loads 13.43 GiB, and 0.11
        # logged 13.47 (llm-d-benchmark empirical-vllm-memory-results.md).
        width = math.ceil(model.moe_intermediate_size / 256) * 256
        experts = model.num_layers * model.num_experts * 3 * model.hidden_size
        rest = max(0.0, linear - experts * model.moe_intermediate_size)
        return round((experts * width * per_param + rest * 2 + embeddings) / tp + rope)
    return round((linear * per_param + embeddings) / tp + rope)


def activation_bytes(model: ModelConfig, tp: int, n_seqs: int, n_batched: int,
                     version: tuple[int, int] = DEFAULT_VLLM) -> int:
    """The torch peak of vLLM's profile run: a dummy forward pass of n_batched tokens split over
    min(n_seqs, n_batched) requests, then a dummy sampler run over one row of logits per request."""
    h = model.hidden_size
    rows = min(n_seqs, n_batched)
    hidden = n_batched * h * 2  # the forward pass's output, alive through the sampler run
    units = SAMPLER_UNITS if version >= SAMPLER_DROP else SAMPLER_UNITS_OLD
    sampler = round(units * rows * model.vocab_size * 4) + hidden
    # Forward: residual + normed input + the MLP's gate/up output and activation (bf16), per GPU.
    if model.num_experts and model.moe_intermediate_size:
        k = model.num_experts_per_tok or 2
        forward = n_batched * 2 * (3 * h + k * (3 * model.moe_intermediate_size // tp + h)) \
            + n_batched * model.num_experts * 4  # router logits (fp32)
    else:
        inter = model.intermediate_size or int(3.5 * h)  # Llama's ratio when config.json is not at hand
        forward = n_batched * 2 * (3 * h + 3 * inter // tp)
    return max(forward, sampler)


def non_torch_bytes(tp: int, version: tuple[int, int] = DEFAULT_VLLM) -> int:
    if version >= NON_TORCH_GROWTH:
        return NON_TORCH_TP if tp > 1 else NON_TORCH_TP1
    return NON_TORCH_TP_OLD if tp > 1 else NON_TORCH_TP1_OLD


def cuda_graph_bytes(model: ModelConfig, engine: Engine, version: tuple[int, int] = DEFAULT_VLLM) -> int:
    """The CUDA-graph estimate vLLM subtracts (0 where it does not, or with --enforce-eager)."""
    if version < CUDA_GRAPHS_FROM or any(a in ("--enforce-eager", "-O0") for a in engine.extra_args):
        return 0
    return model.num_layers * CUDA_GRAPH_PER_LAYER


def kv_tokens(model: ModelConfig, tp: int, kv_cache_dtype: str, available: int, max_len: int, batched: int,
              hybrid: bool = True) -> tuple[int, str | None]:
    """The `GPU KV cache size` vLLM would log for `available` bytes per GPU, and a note when sliding-window
    layers make it a concurrency figure (see kv_pool)."""
    tokens, _, note = kv_pool(model, tp, kv_cache_dtype, available, max_len, batched, hybrid)
    return tokens, note


def kv_pool(model: ModelConfig, tp: int, kv_cache_dtype: str, available: int, max_len: int, batched: int,
            hybrid: bool = True) -> tuple[int, int, str | None]:
    """(logged tokens, blocks in the pool = vllm:cache_config_info's num_gpu_blocks, note). vLLM puts layers
    of one kind in groups of equal size that share one block pool (kv_cache_utils): blocks = available //
    (page x group size); a request needs cdiv(maxModelLen, block) blocks in a full-attention group and
    cdiv(min(window - 1 + batched tokens, maxModelLen), block) + 1 in a sliding one; tokens = blocks /
    blocks-per-request x maxModelLen."""
    if available <= 0:
        return 0, 0, None
    block = MLA_BLOCK if model.mla_latent_dim else BLOCK
    page = block * kv_bytes_per_layer(model, tp, kv_cache_dtype)
    window = model.sliding_window
    n_sliding = model.num_layers - (model.full_attention_layers or 0) if window else 0
    if not window or not hybrid or n_sliding <= 0 or window >= max_len:
        blocks = available // (page * model.num_layers)
        return blocks * block, blocks, None
    n_full = model.num_layers - n_sliding
    counts = [c for c in (n_full, n_sliding) if c > 0]
    group = min(counts)
    if max(counts) < group * 1.25:  # nearly equal: one group per kind, padded, rather than many small groups
        group = max(counts)
    full_groups, sliding_groups = math.ceil(n_full / group), math.ceil(n_sliding / group)
    blocks = available // (page * group)
    per_request = full_groups * math.ceil(max_len / block) \
        + sliding_groups * (math.ceil(min(window - 1 + batched, max_len) / block) + 1)
    tokens = int(blocks / per_request * max_len)
    return tokens, blocks, (f"sliding window {window} on {n_sliding} of {model.num_layers} layers: vLLM's KV groups "
                            f"give {blocks} blocks of {group} layers, {per_request} per request of maxModelLen "
                            f"{max_len}; the token figure is concurrency x maxModelLen, as vLLM logs it")


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


def _version_text(version: tuple[int, int] | None) -> tuple[tuple[int, int], str | None]:
    if version is None:
        return DEFAULT_VLLM, (f"the engine image names no vLLM version; planned as {DEFAULT_VLLM[0]}."
                              f"{DEFAULT_VLLM[1]}, the pinned engine")
    if version < (0, 11):
        return version, (f"vLLM {version[0]}.{version[1]} predates the V1-only engine this plan models "
                         "(its overhead grew with maxModelLen); expect a smaller cache than planned")
    return version, None


def plan(model: ModelConfig, gpu: GPUProduct, tp: int, engine: Engine | None = None,
         traffic: Traffic | None = None, draft: ModelConfig | None = None, model_name: str = "model",
         vllm_version: tuple[int, int] | None = DEFAULT_VLLM, lora: bool = False,
         kv_cache_memory_bytes: int | None = None) -> Plan:
    """`lora`: the engine serves adapters (--enable-lora): its adapter buffers and shrink step are planned
    (oculis_operator.lora_capacity). `kv_cache_memory_bytes`: vLLM's --kv-cache-memory-bytes (on its CPU
    backend also VLLM_CPU_KVCACHE_SPACE): the KV budget as given, gpuMemoryUtilization and profiling skipped
    (gpu_worker.determine_available_memory, cpu_worker.determine_available_memory)."""
    e = engine or Engine()
    version, version_note = _version_text(vllm_version)
    notes = [version_note] if version_note else []
    if not gpu.torch_total_gib:
        notes.append(f"torch's total memory for {gpu.key} is unknown; planned from the node label "
                     f"({gpu.memory_mib} MiB), about 0.5 GiB more than vLLM will see")
    max_len, seqs, batched, per_seq = resolve_engine(engine, traffic, model)
    total = gpu.torch_total_bytes
    kv_tok = kv_bytes_per_token(model, tp, e.kv_cache_dtype)
    weights = weights_bytes_per_gpu(model, tp, e.quantization)
    spec = e.speculative if e.speculative and e.speculative.enabled else None
    extra_kv = False  # draft or MTP layers share the block pool: plan them as full-attention layers
    if draft is not None and spec is not None:
        kv_tok += kv_bytes_per_token(draft, tp, e.kv_cache_dtype)
        weights += weights_bytes_per_gpu(draft, tp)
        extra_kv = True
    elif spec is not None and spec.method == "mtp":  # one extra decoder layer of the target
        kv_tok += kv_bytes_per_token(model, tp, e.kv_cache_dtype) // model.num_layers
        extra_kv = True
    adapters = lora_capacity.lora_weight_bytes(model, tp, e) if lora else 0
    if lora:
        weights += adapters
        notes.append(f"LoRA: {e.max_loras or 1} adapter slots at rank {e.max_lora_rank or 16} take "
                     f"{adapters / GiB:.2f} GiB/GPU (q,k,v,o,gate,up,down of every layer), counted with the weights")
    usable = int(total * e.gpu_memory_utilization)
    graphs = cuda_graph_bytes(model, e, version)
    non_torch = non_torch_bytes(tp, version)
    hybrid = "--disable-hybrid-kv-cache-manager" not in e.extra_args

    def overhead_and_budget(n_seqs: int, n_batched: int) -> tuple[int, int]:
        """(runtime overhead, KV budget) in bytes for a batch of n_seqs sequences and n_batched tokens a step."""
        overhead = activation_bytes(model, tp, n_seqs, n_batched, version) + non_torch + graphs + (
            lora_capacity.lora_activation_bytes(e, n_batched) if lora else 0)
        if kv_cache_memory_bytes is not None:
            return overhead, kv_cache_memory_bytes
        return overhead, usable - weights - overhead

    def pool_for(budget: int, n_batched: int) -> tuple[int, int, str | None]:
        if extra_kv:
            block = MLA_BLOCK if model.mla_latent_dim else BLOCK
            blocks = max(0, budget) // (kv_tok * block)
            return blocks * block, blocks, None
        return kv_pool(model, tp, e.kv_cache_dtype, budget, max_len, n_batched, hybrid)

    def tokens_for(budget: int, n_batched: int) -> tuple[int, str | None]:
        tokens, _, note = pool_for(budget, n_batched)
        return tokens, note

    overhead, budget = overhead_and_budget(seqs, batched)
    tokens, blocks, group_note = pool_for(budget, batched)
    if group_note:
        notes.append(group_note)
    base: dict[str, Any] = dict(
        gpu_memory_bytes=total, weights_bytes_per_gpu=weights, kv_bytes_per_token=kv_tok, kv_budget_bytes=budget,
        kv_cache_tokens=tokens, max_concurrency=tokens // per_seq if per_seq else 0, tokens_per_seq=per_seq,
        max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=batched,
        safe_max_num_seqs=tokens // per_seq if per_seq else 0,
        safe_max_model_len=min(tokens, model.max_position_embeddings),
        requested_bytes=usable, activation_bytes=overhead - non_torch - graphs, non_torch_bytes=non_torch,
        cuda_graph_bytes=graphs, vllm_version=f"{version[0]}.{version[1]}", notes=tuple(notes), kv_blocks=blocks,
        lora_weights_bytes=adapters,
        lora_shrink_bytes=lora_capacity.lora_activation_bytes(e, batched) if lora else 0,
    )
    where = (f"{model_name} on {gpu.key} x{tp}, gpuMemoryUtilization {e.gpu_memory_utilization}, vLLM "
             f"{version[0]}.{version[1]}: weights {weights / GiB:.2f} GiB/GPU, overhead ~{overhead / GiB:.2f} GiB, "
             f"KV {kv_tok} bytes/token/GPU")
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
            n_batched = e.max_num_batched_tokens or max(prof_batched, n)
            n_tokens = tokens_for(overhead_and_budget(n, n_batched)[1], n_batched)[0]
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


DRIFT_PERCENT = 5.0  # CapacityOK reason PlanDrift above this difference between plan and engine


def observed_tokens(plan: Plan, num_gpu_blocks: int) -> int:
    """The engine's token capacity from its num_gpu_blocks, on the plan's own scale: blocks x block size for
    plain attention, the same concurrency x maxModelLen figure for KV groups."""
    if plan.kv_blocks <= 0:
        return 0
    return round(plan.kv_cache_tokens * num_gpu_blocks / plan.kv_blocks)


def drift_percent(planned: int, observed: int) -> float:
    """How far the plan is from what the engine got, in % of the observed (> 0: the plan over-promised)."""
    return round(100 * (planned - observed) / observed, 2) if observed else 100.0


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
