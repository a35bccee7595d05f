"""Engine settings as vLLM would resolve them, and the refusals vLLM would make at start-up.

The KV block count is the operator's capacity plan (`oculis_operator.capacity.plan`): the simulator and
the operator's admission check can never disagree about what fits.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from oculis import gpus
from oculis.base import format_errors
from oculis.gpus import GPUProduct
from oculis.upstream import Engine, ModelConfig, Speculative
from oculis_measure.inputs import InputError, load_yaml, read_text
from oculis_operator import capacity, catalog
from oculis_sim import specdecode, steptime, versions

GiB = 1024**3
CPU_BLOCK = 128  # vLLM's CPU backend's KV block (cache_config_info block_size on the real engine)

# Products the simulator needs facts for even where the CRD enum (oculis.gpus) does not list them yet;
# facts from ../shared/notes/simulator.md section 4 and vllm-engine section 6 (GFD names, nvidia-smi MiB).
# The schema's own entry wins when it has one.
_EXTRA = (
    GPUProduct("H100-PCIe-80GB", "NVIDIA-H100-PCIe", 81559, "hopper", 9, 0, 2000, 756, 1513),
    GPUProduct("L4-24GB", "NVIDIA-L4", 23034, "ada-lovelace", 8, 9, 300, 121, 242),
    # vLLM's CPU backend: no datasheet roofline applies, so it needs a fitted --step-profile; the memory
    # figure is the node's, of which the default KV budget is gpu_memory_utilization's share (see kv_memory).
    GPUProduct("CPU", "CPU", 16384, "cpu", 0, 0),
)
EXTRA_GPUS: dict[str, GPUProduct] = {p.key: p for p in _EXTRA if p.key not in gpus.GPU_PRODUCTS}


class SimConfigError(ValueError):
    """One line naming the flag, the value and the fix."""


def lookup_gpu(name: str) -> GPUProduct:
    try:
        return gpus.lookup(name)
    except KeyError:
        for p in EXTRA_GPUS.values():
            if name in (p.key, p.gfd_product):
                return p
        choices = ", ".join(sorted({*gpus.GPU_PRODUCTS, *EXTRA_GPUS}))
        raise SimConfigError(f"--gpu {name!r}: no GPU facts for this product; use one of {choices} (or its "
                             "nvidia.com/gpu.product value)") from None


_SIZE = re.compile(r"^(\d+)([kKmMgG]?)$")
_UNIT = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20, "g": 10**9, "G": 2**30}


def parse_int(flag: str, text: str) -> int:
    """vLLM's human-readable integers: 2048, 8k (8000), 8K (8192)."""
    m = _SIZE.match(text.strip())
    if not m:
        raise SimConfigError(f"{flag} {text!r}: not an integer (vLLM also takes 8k = 8000, 8K = 8192)")
    return int(m.group(1)) * _UNIT[m.group(2)]


def kv_memory(gpu: GPUProduct, flag: str | None, cpu_kvcache_space: str | None) -> int | None:
    """The KV budget vLLM 0.32 is told, or None for its memory plan (gpu_memory_utilization's share minus
    weights and overheads, on a CPU of the node's memory). On the CPU backend VLLM_CPU_KVCACHE_SPACE (whole
    GiB) replaces --kv-cache-memory-bytes (platforms/cpu.py; measured: with both, the variable's size)."""
    if gpu.family == "cpu" and cpu_kvcache_space is not None:
        if not cpu_kvcache_space.strip().isdigit() or int(cpu_kvcache_space) < 1:
            raise SimConfigError(f"VLLM_CPU_KVCACHE_SPACE={cpu_kvcache_space!r}: a whole number of GiB (e.g. 1) is "
                                 "needed; unset it to size the cache with --kv-cache-memory-bytes")
        return int(cpu_kvcache_space) * GiB
    if flag is None:
        return None
    size = parse_int("--kv-cache-memory-bytes", flag)
    if size < 1:
        raise SimConfigError(f"--kv-cache-memory-bytes {flag}: must be positive (e.g. 1M = 1,048,576 bytes)")
    return size


@dataclass(frozen=True)
class Settings:
    model_name: str
    served_names: tuple[str, ...]
    model: ModelConfig
    gpu: GPUProduct
    tp: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    gpu_memory_utilization: float
    kv_cache_dtype: str
    quantization: str | None
    prefix_caching: bool
    spec: specdecode.SpecConfig | None
    draft: ModelConfig | None
    acceptance_rate: float
    num_blocks: int
    kv_cache_tokens: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    seed: int
    model_path: str = ""  # what /v1/models calls `root` (vLLM: the model argument as given)
    num_gpu_blocks_override: int | None = None
    mean_logprob: float = -0.4  # the modelled answers' mean token logprob (oculis_sim.logprobs)
    prompt_tokens_details: bool = False  # --enable-prompt-tokens-details: usage carries cached tokens
    vllm_version: tuple[int, int] = capacity.DEFAULT_VLLM  # the engine release whose overheads are modelled
    block_size: int = capacity.BLOCK  # KV block in tokens (vLLM's CPU backend uses 128)
    step_profile: steptime.FittedSteps | None = None  # a fitted step-time model replaces the roofline
    kv_cache_memory_bytes: int | None = None  # the KV budget given (kv_memory), None: the memory plan's
    scheduling_policy: str = "fcfs"  # --scheduling-policy: fcfs or priority (requests' `priority` field honoured)

    @property
    def version_profile(self) -> versions.VersionProfile:
        return versions.profile(self.vllm_version)


def load_model_config(path: Path) -> ModelConfig:
    # The CLI's strict reader: a directory, non-UTF-8 bytes or too deep a nesting is one line, not a traceback.
    try:
        data = load_yaml(read_text(path, "--model-config"), f"--model-config {path}")
    except InputError as exc:
        raise SimConfigError(str(exc)) from None
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        raise SimConfigError(f"--model-config {path}: " + format_errors(exc, "modelConfig").replace("\n", "; ")
                             ) from None


def resolve(model_name: str, gpu_name: str | None, *, model_config: Path | ModelConfig | None = None, tp: int = 1,
            max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
            max_model_len: str | None = None, gpu_memory_utilization: float = 0.92, kv_cache_dtype: str = "auto",
            quantization: str | None = None, prefix_caching: bool = True, speculative_config: str | None = None,
            acceptance_rate: float | None = None, served_names: tuple[str, ...] = (), seed: int = 0,
            num_gpu_blocks_override: int | None = None, vllm_version: str | tuple[int, int] | None = None,
            block_size: int | None = None, mean_logprob: float = -0.4,
            prompt_tokens_details: bool = False, step_profile: Path | steptime.FittedSteps | None = None,
            kv_cache_memory_bytes: str | None = None, cpu_kvcache_space: str | None = None) -> Settings:
    if not gpu_name:
        raise SimConfigError("--gpu: missing; name the GPU product to simulate (e.g. --gpu H100-80GB, or set "
                             "OCULIS_SIM_GPU)")
    gpu = lookup_gpu(gpu_name)
    try:  # the same fact the operator reads from the engine image tag; default: the pinned engine
        version = (capacity.DEFAULT_VLLM if vllm_version is None else vllm_version if isinstance(vllm_version, tuple)
                   else versions.parse(vllm_version))
    except versions.VersionError as exc:
        raise SimConfigError(str(exc)) from None
    if block_size is None:  # vLLM's CPU backend uses 128-token blocks
        block_size = CPU_BLOCK if gpu.family == "cpu" else capacity.BLOCK
    if block_size not in (8, 16, 32, 64, 128, 256):
        raise SimConfigError(f"--block-size {block_size}: use one of 8, 16, 32, 64, 128 (CPU backend), 256")
    fitted = load_step_profile(step_profile) if isinstance(step_profile, Path) else step_profile
    if gpu.family == "cpu" and fitted is None:
        raise SimConfigError(f"--gpu {gpu_name}: a CPU has no datasheet roofline; pass --step-profile FILE fitted on "
                             "it (e.g. bench/data/cpu_step_profile.json)")
    kv_given = kv_memory(gpu, kv_cache_memory_bytes, cpu_kvcache_space)
    inline = load_model_config(model_config) if isinstance(model_config, Path) else model_config
    try:
        model = catalog.lookup(model_name, inline)
    except KeyError:
        raise SimConfigError(f"--model {model_name!r}: not in the built-in catalog; pass --model-config FILE with "
                             "its architecture (paramsBillions, numLayers, hiddenSize, numAttentionHeads, numKvHeads, "
                             "headDim, vocabSize, maxPositionEmbeddings) or use one of: "
                             f"{', '.join(sorted(catalog.CATALOG))}") from None
    if tp < 1:
        raise SimConfigError(f"--tensor-parallel-size {tp}: must be a positive integer")
    if model.num_attention_heads % tp:
        raise SimConfigError(f"--tensor-parallel-size {tp}: Total number of attention heads "
                             f"({model.num_attention_heads}) must be divisible by tensor parallel size ({tp}); "
                             "use a divisor")
    if not 0 < gpu_memory_utilization <= 1:
        raise SimConfigError(f"--gpu-memory-utilization {gpu_memory_utilization}: must be in (0, 1]")
    if kv_cache_dtype not in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16"):
        raise SimConfigError(f"--kv-cache-dtype {kv_cache_dtype!r}: not simulated; use auto or fp8")
    kv_dtype = "fp8" if kv_cache_dtype.startswith("fp8") else "auto"
    if quantization is not None and quantization not in capacity.QUANT_BYTES:
        raise SimConfigError(f"--quantization {quantization!r}: not simulated; use one of "
                             f"{', '.join(sorted(capacity.QUANT_BYTES))} or leave it unset")
    default_seqs, default_tokens = capacity.vllm_defaults(gpu, version)  # the operator's plan picks the same
    seqs = max_num_seqs if max_num_seqs is not None else default_seqs
    if seqs < 1:
        raise SimConfigError(f"--max-num-seqs {seqs}: must be a positive integer")
    spec = None
    draft = None
    if speculative_config:
        try:
            spec = specdecode.parse(speculative_config)
        except specdecode.SpecConfigError as exc:
            raise SimConfigError(f"--speculative-config: {exc}") from None
        if spec.draft_model:
            try:
                draft = catalog.lookup(spec.draft_model)
            except KeyError:
                raise SimConfigError(f"--speculative-config: draft model {spec.draft_model!r} is not in the built-in "
                                     "catalog; use a catalog model of the same family or a method (ngram, eagle, "
                                     "eagle3, mtp)") from None
            if draft.vocab_size != model.vocab_size:
                raise SimConfigError(f"--speculative-config: draft model {spec.draft_model} has a vocabulary of "
                                     f"{draft.vocab_size} tokens but {model_name} has {model.vocab_size}; vLLM's draft "
                                     "model uses the target's tokenizer, so pick a draft of the same family")
    tokens = max_num_batched_tokens if max_num_batched_tokens is not None else default_tokens
    if tokens < seqs and max_num_batched_tokens is None:
        tokens = seqs
    if tokens < seqs:
        # vLLM's own words (vllm/config/scheduler.py), then the fix
        raise SimConfigError(f"--max-num-batched-tokens {tokens}: max_num_batched_tokens ({tokens}) must be greater "
                             f"than or equal to max_num_seqs ({seqs}); raise --max-num-batched-tokens to at least "
                             f"{seqs} or lower --max-num-seqs")
    alpha = acceptance_rate
    if alpha is None:
        alpha = specdecode.DEFAULT_ACCEPTANCE[spec.method] if spec else 0.0
    if not 0 <= alpha <= 1:
        raise SimConfigError(f"--acceptance-rate {alpha}: must be between 0 and 1 (per-position draft acceptance)")

    auto_len = max_model_len in ("auto", "-1")
    length = model.max_position_embeddings
    if max_model_len is not None and not auto_len:
        length = parse_int("--max-model-len", max_model_len)
        if length > model.max_position_embeddings:
            raise SimConfigError(
                f"--max-model-len {length}: User-specified max_model_len ({length}) is greater than the derived "
                f"max_model_len (max_position_embeddings={model.max_position_embeddings} in model's config.json); "
                f"use at most {model.max_position_embeddings}")
        if length < 16:
            raise SimConfigError(f"--max-model-len {length}: must be at least 16")
    engine = Engine(max_model_len=length, max_num_seqs=seqs, max_num_batched_tokens=max(tokens, seqs),
                    gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_dtype,
                    quantization=quantization,
                    speculative=(Speculative(draft_model=spec.draft_model or spec.head, num_speculative_tokens=min(
                        spec.num_speculative_tokens, 16), method=None if spec.draft_model else spec.method)
                        if spec else None))
    plan = capacity.plan(model, gpu, tp, engine, draft=draft, model_name=model_name, vllm_version=version,
                         kv_cache_memory_bytes=kv_given)
    if plan.kv_budget_bytes <= 0:
        raise SimConfigError(
            f"--gpu-memory-utilization {gpu_memory_utilization}: No available memory for the cache blocks. Try "
            "increasing `gpu_memory_utilization` when initializing the engine (or a larger --gpu, more "
            "--tensor-parallel-size, --quantization)")
    kv_tokens = plan.kv_cache_tokens
    if num_gpu_blocks_override is not None:  # vLLM's testing knob: the pool size, whatever memory says
        if num_gpu_blocks_override < 2:
            raise SimConfigError(f"--num-gpu-blocks-override {num_gpu_blocks_override}: must be at least 2")
        kv_tokens = num_gpu_blocks_override * block_size
    kv_tokens -= kv_tokens % block_size
    # One block of the pool is vLLM's null block: a sequence can use the rest.
    usable = max(0, kv_tokens - block_size)
    if auto_len:
        length = min(model.max_position_embeddings, usable)
    elif usable < length:
        need = length * plan.kv_bytes_per_token / GiB
        # with --num-gpu-blocks-override the pool is the override's blocks, whatever memory would give
        have = (plan.kv_budget_bytes if num_gpu_blocks_override is None
                else num_gpu_blocks_override * block_size * plan.kv_bytes_per_token) / GiB
        raise SimConfigError(
            f"--max-model-len {length}: To serve at least one request with the model's max seq len ({length}), "
            f"({need:.2f} GiB KV cache is needed, which is larger than the available KV cache memory ({have:.2f} "
            f"GiB). Based on the available memory, the estimated maximum model length is {usable}. "
            "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")
    return Settings(
        model_name=model_name, served_names=served_names or (model_name,), model=model, gpu=gpu, tp=tp,
        max_num_seqs=seqs, max_num_batched_tokens=tokens, max_model_len=length,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_dtype, quantization=quantization,
        prefix_caching=prefix_caching, spec=spec, draft=draft, acceptance_rate=alpha,
        num_blocks=kv_tokens // block_size, kv_cache_tokens=kv_tokens,
        weights_bytes_per_gpu=plan.weights_bytes_per_gpu, kv_bytes_per_token=plan.kv_bytes_per_token, seed=seed,
        vllm_version=version, block_size=block_size, model_path=model_name,
        num_gpu_blocks_override=num_gpu_blocks_override, mean_logprob=mean_logprob,
        prompt_tokens_details=prompt_tokens_details, step_profile=fitted, kv_cache_memory_bytes=kv_given)


def load_step_profile(path: Path) -> steptime.FittedSteps:
    """A fitted step-time model (JSON/YAML with the FittedSteps fields), one line naming the flag if wrong."""
    try:
        data = load_yaml(read_text(path, "--step-profile"), f"--step-profile {path}")
    except InputError as exc:
        raise SimConfigError(str(exc)) from None
    fields = set(steptime.FittedSteps.__dataclass_fields__)
    if not isinstance(data, dict) or not {"step_s", "request_s", "prefill_token_s", "decode_token_s"} <= set(data):
        raise SimConfigError(f"--step-profile {path}: needs step_s, request_s, prefill_token_s and decode_token_s "
                             "(seconds)")
    for k, v in data.items():  # YAML 1.1 reads 2e-5 (no dot) as a string
        if k != "source" and isinstance(v, str):
            with contextlib.suppress(ValueError):
                data[k] = float(v)
    unknown = sorted(set(data) - fields)
    if unknown:
        raise SimConfigError(f"--step-profile {path}: {unknown[0]}: unknown key; use {', '.join(sorted(fields))}")
    bad = [k for k, v in data.items() if k != "source" and (isinstance(v, bool) or not isinstance(v, int | float)
                                                            or not 0 <= v < 60)]
    if bad:
        raise SimConfigError(f"--step-profile {path}: {bad[0]}: {data[bad[0]]!r} must be seconds between 0 and 60")
    return steptime.FittedSteps(**data)


def cost_models(s: Settings) -> tuple[steptime.StepCostModel, steptime.StepCostModel | None]:
    """The target's step cost and, for a draft model, the draft's (its weights are part of the plan's)."""
    if s.step_profile is not None:
        return s.step_profile.cost_model(), None
    # 8-bit linear weights (an fp8 checkpoint such as DeepSeek-V3, whose dtypeBytes is its 2-byte compute
    # dtype, or --quantization fp8) run the 8-bit tensor-core rate: the capacity plan's bytes per weight decides.
    fp8 = capacity.weight_bytes_per_param(s.model, s.quantization) == 1.0
    target_weights = capacity.weights_bytes_per_gpu(s.model, s.tp, s.quantization)
    era = s.version_profile
    target = steptime.cost_model(s.model, s.gpu, s.tp, target_weights,
                                 capacity.kv_bytes_per_token(s.model, s.tp, s.kv_cache_dtype), fp8, era)
    draft = None
    if s.draft is not None:
        draft = steptime.cost_model(s.draft, s.gpu, s.tp, capacity.weights_bytes_per_gpu(s.draft, s.tp),
                                    capacity.kv_bytes_per_token(s.draft, s.tp, s.kv_cache_dtype), version=era)
    return target, draft
