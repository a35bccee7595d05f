"""GPUUpstream: a model served by vLLM on a GPU pool, or an external provider.

The CRD schema (`crds/gpuupstreams.oculis.dev.yaml`) is generated from these models by
`oculis.crdgen`; CEL rules that span fields live in `CEL_RULES` next to the models they guard.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from oculis.base import Model
from oculis.gpus import GPU_PRODUCTS
from oculis.router import NAME_PATTERN, Pricing, Provider

GPUProductName = Literal["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L40S-48GB"]
assert set(GPUProductName.__args__) == set(GPU_PRODUCTS)  # type: ignore[attr-defined]

# Kubernetes names of the Deployment/Service we derive ("<name>-vllm") must stay within 63 chars.
MAX_NAME = 52


class GPU(Model):
    product: GPUProductName = Field(description="GPU model; mapped to the nvidia.com/gpu.product node label")
    count: int = Field(1, ge=1, le=16, description="GPUs per replica = tensor-parallel size")


class Toleration(Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class ResourceList(Model):
    cpu: str | None = None
    memory: str | None = None


class Resources(Model):
    requests: ResourceList | None = None
    limits: ResourceList | None = None


class ModelConfig(Model):
    """Architecture facts for a model outside the built-in catalog (from its HF config.json)."""

    params_billions: float = Field(gt=0, description="Total parameters in billions")
    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1, description="Key/value heads (GQA); equal to attention heads for MHA")
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    dtype_bytes: int = Field(2, ge=1, le=4, description="Bytes per weight of the checkpoint (bf16: 2, fp8: 1)")
    mla_latent_dim: int | None = Field(None, ge=1, description="MLA: kv_lora_rank + qk_rope_head_dim (e.g. 576)")


class Speculative(Model):
    enabled: bool = True
    draft_model: str | None = Field(None, description="Draft model (HF id) for draft-model speculation")
    method: Literal["ngram", "eagle", "eagle3", "mtp"] | None = Field(None, description="Method without a draft model")
    num_speculative_tokens: int = Field(4, ge=1, le=16)
    acceptance_threshold: float | None = Field(
        None, gt=0, le=1, description="Alert when the measured acceptance rate falls below this"
    )


class Engine(Model):
    max_model_len: int | None = Field(None, ge=16, description="Longest sequence (prompt + output) to serve")
    max_num_seqs: int | None = Field(None, ge=1, description="Sequences scheduled at once")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Token budget per engine step")
    scheduler_policy: Literal["fcfs", "priority"] = "fcfs"
    preemption_mode: Literal["recompute", "swap"] = Field(
        "recompute", description="vLLM V1 always recomputes; `swap` is refused at apply time"
    )
    gpu_memory_utilization: float = Field(0.92, gt=0, le=1, description="Share of each GPU's memory for vLLM")
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    quantization: Literal["awq", "gptq", "fp8", "compressed-tensors"] | None = None
    prefix_caching: bool = True
    speculative: Speculative | None = None
    extra_args: list[str] = Field(default_factory=list, description="Further vllm serve flags, appended last")


class Traffic(Model):
    profile: Literal["interactive", "rag", "batch"] = "interactive"
    avg_prompt_tokens: int | None = Field(None, ge=1)
    avg_output_tokens: int | None = Field(None, ge=1)


class Rollout(Model):
    strategy: Literal["Auto", "Manual"] = Field(
        "Auto", description="Auto: surge when a spare GPU of the product exists, else one at a time"
    )
    max_surge: int | None = Field(None, ge=0)
    max_unavailable: int | None = Field(None, ge=0)


class SecretKeyRef(Model):
    name: str = Field(pattern=NAME_PATTERN)
    key: str = Field("api-key", min_length=1)


class ProviderPromptCache(Model):
    min_prefix_tokens: int | None = Field(None, ge=0, description="OpenAI: shortest cached prefix")
    breakpoints: int | None = Field(None, ge=0, le=4, description="Anthropic: cache_control markers")
    ttl: Literal["5m", "1h"] | None = None


class GPUUpstreamSpec(Model):
    provider: Provider
    model: str = Field(min_length=1, description="Model id (Hugging Face id for vllm)")
    # self-hosted
    replicas: int | None = Field(None, ge=0, le=1000)
    gpu: GPU | None = None
    node_selector: dict[str, str] | None = None
    pod_annotations: dict[str, str] | None = Field(None, description="Extra annotations on the engine pods")
    tolerations: list[Toleration] | None = None
    image: str | None = None
    resources: Resources | None = None
    model_config_: ModelConfig | None = Field(None, alias="modelConfig")
    engine: Engine | None = None
    traffic: Traffic | None = None
    rollout: Rollout | None = None
    # external
    base_url: str | None = Field(None, alias="baseURL")
    api_key_secret_ref: SecretKeyRef | None = None
    prompt_cache: ProviderPromptCache | None = None
    pricing: Pricing | None = None

    @property
    def self_hosted(self) -> bool:
        return self.provider == "vllm"

    @model_validator(mode="after")
    def _shape(self) -> GPUUpstreamSpec:
        # Same rules as CEL_RULES below, for the Python API and the config file.
        if self.self_hosted and self.gpu is None:
            raise ValueError("gpu: a self-hosted (vllm) upstream needs `gpu: {product, count}`")
        if not self.self_hosted and (self.gpu is not None or self.engine is not None):
            raise ValueError("gpu/engine: only self-hosted (vllm) upstreams take `gpu` or `engine`")
        e = self.engine
        if e and e.max_num_seqs and e.max_num_batched_tokens and e.max_num_batched_tokens < e.max_num_seqs:
            raise ValueError("engine.maxNumBatchedTokens must be >= engine.maxNumSeqs (vLLM refuses otherwise)")
        if e and e.preemption_mode == "swap":
            raise ValueError(SWAP_MESSAGE)
        return self


SWAP_MESSAGE = (
    "engine.preemptionMode: swap is not supported: vLLM V1 always preempts by recompute (swap was removed "
    "with the V0 engine); set preemptionMode: recompute or leave it unset"
)

# CEL rules on `spec` (x-kubernetes-validations): evaluated by the API server at `kubectl apply`.
CEL_RULES: list[dict[str, str]] = [
    {"rule": "self.provider != 'vllm' || has(self.gpu)",
     "message": "spec.gpu is required when provider is vllm: set gpu: {product: H100-80GB, count: 1}",
     "fieldPath": ".gpu"},
    {"rule": "self.provider == 'vllm' || (!has(self.gpu) && !has(self.engine))",
     "message": "spec.gpu and spec.engine apply only to provider vllm; remove them for external providers"},
    {"rule": "!has(self.engine) || !has(self.engine.maxNumSeqs) || !has(self.engine.maxNumBatchedTokens) "
             "|| self.engine.maxNumBatchedTokens >= self.engine.maxNumSeqs",
     "message": "spec.engine.maxNumBatchedTokens must be >= spec.engine.maxNumSeqs",
     "fieldPath": ".engine.maxNumBatchedTokens"},
    {"rule": "!has(self.engine) || !has(self.engine.preemptionMode) || self.engine.preemptionMode != 'swap'",
     "message": SWAP_MESSAGE, "fieldPath": ".engine.preemptionMode"},
]
NAME_RULE = {"rule": f"size(self.metadata.name) <= {MAX_NAME}",
             "message": f"metadata.name must be at most {MAX_NAME} characters (derived Deployment names add a suffix)"}


class Condition(Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str | None = None
    observed_generation: int | None = None


class Capacity(Model):
    gpu_memory_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_cache_tokens: int
    max_concurrency: int


class GPUUpstreamStatus(Model):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    replicas: int | None = None
    ready_replicas: int | None = None
    updated_replicas: int | None = None
    capacity: Capacity | None = None
    engine_hash: str | None = Field(None, description="Hash of the engine settings every ready replica runs")
    desired_engine_hash: str | None = None
    endpoint: str | None = None
    gpu: str | None = Field(None, description="Printer column: product x count")
    rollout: str | None = Field(None, description="What the rollout is doing or waiting for")


class GPUUpstream(Model):
    """The Python API of the kind; `spec` as in the CRD."""

    api_version: Literal["oculis.dev/v1alpha1"] = "oculis.dev/v1alpha1"
    kind: Literal["GPUUpstream"] = "GPUUpstream"
    name: str = Field(pattern=NAME_PATTERN, max_length=MAX_NAME)
    spec: GPUUpstreamSpec
