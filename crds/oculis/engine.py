"""A GPUUpstream's vLLM engine settings (rendered as `vllm serve` flags) and the model facts and
traffic the capacity plan reads.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from oculis.adapters import LoraRank
from oculis.base import Model
from oculis.router_upstream import NAME_PATTERN


class ModelConfig(Model):
    """Architecture facts for a model outside the built-in catalog (from its HF config.json)."""

    # Bounded: an unbounded float (1e308, inf) overflowed the capacity arithmetic into a traceback.
    params_billions: float = Field(gt=0, le=100_000, description="Total parameters in billions (at most 100000)")
    num_layers: int = Field(ge=1)
    """Transformer layers (num_hidden_layers)"""
    hidden_size: int = Field(ge=1)
    """Hidden size (hidden_size)"""
    num_attention_heads: int = Field(ge=1)
    """Attention heads; gpu.count must divide it"""
    num_kv_heads: int = Field(ge=1, description="Key/value heads (GQA); equal to attention heads for MHA")
    head_dim: int = Field(ge=1)
    """Dimension of one attention head"""
    vocab_size: int = Field(ge=1)
    """Vocabulary size; a draft model must match it"""
    max_position_embeddings: int = Field(ge=1)
    """Longest context the model supports"""
    dtype_bytes: int = Field(2, ge=1, le=4, description="Bytes per weight of the checkpoint (bf16: 2, fp8: 1)")
    mla_latent_dim: int | None = Field(None, ge=1, description="MLA: kv_lora_rank + qk_rope_head_dim (e.g. 576)")
    # Optional facts that sharpen the capacity plan (oculis_operator.hfconfig reads them from config.json).
    tie_word_embeddings: bool = False
    """The output head shares the embedding matrix (counted once in paramsBillions)"""
    intermediate_size: int | None = Field(None, ge=1, description="MLP width (intermediate_size), for the "
                                          "activation peak")
    num_experts: int | None = Field(None, ge=1, description="MoE: routed experts per layer")
    num_experts_per_tok: int | None = Field(None, ge=1, description="MoE: experts each token is routed to")
    moe_intermediate_size: int | None = Field(None, ge=1, description="MoE: width of one expert's MLP")
    quantization: Literal["fp8", "int8", "awq", "gptq", "w4a16", "nvfp4", "mxfp4"] | None = Field(
        None, description="Weight format of the checkpoint (its quantization_config): fp8/int8 are 1 byte per "
        "weight, awq/gptq/w4a16 4 bits plus group scales; embeddings and lm_head stay 16-bit")
    sliding_window: int | None = Field(None, ge=1, description="Sliding-window attention span in tokens")
    full_attention_layers: int | None = Field(None, ge=0, description="With slidingWindow: how many layers use "
                                              "full attention (the rest use the window); unset = none")


class Speculative(Model):
    """Speculative decoding: a draft model or a method proposes tokens the target verifies."""

    enabled: bool = True
    """Turn speculation on (true) or off without removing the block"""
    draft_model: str | None = Field(None, description="Draft model (HF id) for draft-model speculation, or with "
                                    "method eagle/eagle3 the EAGLE head checkpoint")
    method: Literal["ngram", "eagle", "eagle3", "mtp"] | None = Field(
        None, description="ngram and mtp need no draft model; eagle and eagle3 take their head in draftModel")
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    """Tokens proposed per step"""
    acceptance_threshold: float | None = Field(
        None, gt=0, le=1, description="Acceptance rate (accepted / draft tokens) below which speculation is a net "
        "loss (about 0.5); with autoDisable it is turned off when a whole window stays below"
    )
    auto_disable: bool = Field(
        False, description="Turn speculation off (a safe rolling restart, capacity re-planned) when the measured "
        "acceptance stays below acceptanceThreshold for a whole window; on again only when the spec changes")

    @model_validator(mode="after")
    def _eagle_needs_its_head(self) -> Speculative:
        # vLLM refuses it at start ("num_speculative_tokens was provided but without speculative model"),
        # found by its own config check (tests/realengine/test_engine_args.py).
        if self.method in ("eagle", "eagle3") and not self.draft_model:
            raise ValueError(f"engine.speculative.method {self.method} needs draftModel: the EAGLE head checkpoint "
                             "(e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B); vLLM refuses the method without one")
        return self


class Engine(Model):
    """vLLM engine settings; rendered as `vllm serve` flags and checked against the KV cache before any restart."""

    max_model_len: int | None = Field(None, ge=16, description="Longest sequence (prompt + output) to serve")
    max_num_seqs: int | None = Field(None, ge=1, description="Sequences scheduled at once")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Token budget per engine step")
    scheduler_policy: Literal["fcfs", "priority"] = "fcfs"
    """fcfs (first come, first served) or priority (requests carry a priority)"""
    preemption_mode: Literal["recompute", "swap"] = Field(
        "recompute", description="vLLM V1 (0.11+) always recomputes and has no flag for it: `recompute` is "
        "accepted and not rendered, `swap` is refused at apply time"
    )
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1, description="Share of each GPU's memory for vLLM")
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    """auto (the model's dtype) or fp8 (halves KV memory per token)"""
    quantization: Literal["awq", "gptq", "fp8", "compressed-tensors"] | None = None
    """Weight quantization of the checkpoint, if any"""
    prefix_caching: bool = True
    """Reuse KV blocks of shared prompt prefixes"""
    speculative: Speculative | None = None
    """Speculative decoding settings"""
    extra_args: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="Further vllm serve flags, appended last")
    max_loras: int | None = Field(None, ge=1, le=64, description="With spec.adapters: LoRA adapters one batch "
                                  "can use at once (vLLM --max-loras, default 1); each slot is planned in GPU memory")
    max_lora_rank: LoraRank | None = Field(
        None, description="With spec.adapters: the largest adapter rank (vLLM --max-lora-rank, default 16)")
    runtime_lora_updating: bool = Field(
        True, description="With spec.adapters: the operator loads and unloads adapters through the engine's API "
        "(VLLM_ALLOW_RUNTIME_LORA_UPDATING), so adding or removing one restarts no pod; false: they are "
        "--lora-modules flags and a change rolls the pods")


class Traffic(Model):
    """What the capacity check plans for: a profile, or average token counts."""

    profile: Literal["interactive", "rag", "batch"] = "interactive"
    """interactive (short chat turns), rag (long prompts, short answers) or batch (throughput)"""
    avg_prompt_tokens: int | None = Field(None, ge=1)
    """Average prompt tokens per request (overrides the profile)"""
    avg_output_tokens: int | None = Field(None, ge=1)
    """Average output tokens per request (overrides the profile)"""


class ConfigMapKeyRef(Model):
    """A key of a ConfigMap in the upstream's namespace."""

    name: str = Field(pattern=NAME_PATTERN)
    """ConfigMap name"""
    key: str = Field("config.json", min_length=1)
    """Key holding the model's config.json"""


class ModelConfigFrom(Model):
    """Where the model's Hugging Face config.json is, read as it is (quantization_config included), e.g.
    `kubectl create configmap llama-config --from-file=config.json`."""

    config_map_key_ref: ConfigMapKeyRef
    """The ConfigMap key holding config.json"""
