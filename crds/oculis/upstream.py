"""GPUUpstream: a model served by vLLM on a GPU pool, or an external provider.

The CRD schema (`crds/gpuupstreams.oculis.dev.yaml`) is generated from these models by
`oculis.crdgen`; CEL rules that span fields live in `CEL_RULES` next to the models they guard.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from oculis.adapters import (
    ADAPTER_CEL_RULES,
    MAX_ADAPTERS,
    Adapter,
    AdapterStatus,
    LoraRank,
    adapter_problem,
    api_servers_problem,
)
from oculis.base import Model
from oculis.gpus import GPU_PRODUCTS
from oculis.router import DEFAULT_PICKER, NAME_PATTERN, PickerName, Pricing, Provider, Timeouts
from oculis.vllm_flags import PINNED_VLLM, VLLM_IMAGE, removed_flag_problem, vllm_version

GPUProductName = Literal["A100-40GB", "A100-80GB", "H100-80GB", "H100-PCIe-80GB", "H100-NVL-94GB", "H200-141GB",
                         "L4-24GB", "L40S-48GB", "A10G-24GB", "B200-180GB"]
assert set(GPUProductName.__args__) == set(GPU_PRODUCTS)  # type: ignore[attr-defined]

# Kubernetes names of the Deployment/Service we derive ("<name>-vllm") must stay within 63 chars.
MAX_NAME = 52
# A Service name is a DNS-1035 label (no dots, starts with a letter), so an upstream's name must be one.
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class GPU(Model):
    """The GPUs each replica gets: product and count (the tensor-parallel size)."""

    product: GPUProductName = Field(description="GPU model; mapped to the nvidia.com/gpu.product node label")
    count: int = Field(1, ge=1, le=16, description="GPUs per replica = tensor-parallel size")


class Toleration(Model):
    """A pod toleration, as in the core API; the GPU taint nvidia.com/gpu is always tolerated."""

    key: str | None = None
    """Taint key to tolerate"""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal"""
    value: str | None = None
    """Taint value (with Equal)"""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to tolerate; empty matches all"""

    @model_validator(mode="after")
    def _as_the_api_server(self) -> Toleration:
        # The pod template's own rules: without them a spec passed `kubectl apply` and its Deployment
        # was refused later (found by e2e/tests/test_schema_dry_run.py).
        if self.key and (why := key_problem(self.key)):
            raise ValueError(f"tolerations[].key: {why}")
        if not self.key and self.operator != "Exists":
            raise ValueError("tolerations[]: a toleration without `key` needs `operator: Exists` (it then "
                             "tolerates every taint)")
        if self.operator == "Exists" and self.value:
            raise ValueError(f"tolerations[].value: must be empty with `operator: Exists` (got {self.value!r})")
        if self.value and not re.fullmatch(LABEL_VALUE, self.value):
            raise ValueError(f"tolerations[].value: {self.value!r} {LABEL_VALUE_RULE}")
        return self


# Kubernetes' syntax for names and values copied into the pod template as they are.
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LABEL_VALUE_RULE = ("is not a valid label value: at most 63 letters, digits, '-', '_' or '.', starting and ending "
                    "with a letter or digit")
_QUALIFIED_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label/annotation key (an optional DNS-subdomain prefix and '/',
    then a name of at most 63 characters), or None."""
    prefix, _, name = key.rpartition("/")
    if not _QUALIFIED_KEY.fullmatch(key) or len(name) > 63 or len(prefix) > 253:
        return (f"{key!r} is not a valid Kubernetes key: an optional DNS prefix such as example.com/, then at most "
                "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    return None


# Kubernetes' resource.Quantity syntax (a number, then an SI or binary suffix or a decimal exponent),
# so a bad quantity is refused at apply, not by the Deployment later. The API server's error message
# quotes a looser expression than its parser accepts ("1.2.3" matched that one).
QUANTITY = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
           "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
           **{f"{p}i": Decimal(1024) ** (i + 1) for i, p in enumerate("KMGTPE")}}


def quantity(text: str) -> Decimal:
    """The value of a quantity QUANTITY accepts (64Gi -> 68719476736)."""
    m = re.fullmatch(QUANTITY, text)
    assert m, text
    number, suffix = m.group(1), m.group(3) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _SUFFIX[suffix]


class ResourceList(Model):
    """CPU and memory quantities (GPUs come from `gpu`)."""

    cpu: str | None = Field(None, pattern=QUANTITY)
    """CPU quantity, e.g. 8 or 500m"""
    memory: str | None = Field(None, pattern=QUANTITY)
    """Memory quantity, e.g. 64Gi"""


class Resources(Model):
    """CPU and memory for the engine container; GPU limits are set from `gpu`."""

    requests: ResourceList | None = None
    """Guaranteed CPU and memory"""
    limits: ResourceList | None = None
    """CPU and memory ceilings"""

    @model_validator(mode="after")
    def _requests_within_limits(self) -> Resources:
        for kind in ("cpu", "memory"):
            want = getattr(self.requests, kind, None) if self.requests else None
            cap = getattr(self.limits, kind, None) if self.limits else None
            if want and cap and quantity(want) > quantity(cap):
                raise ValueError(f"resources.requests.{kind} {want} is more than resources.limits.{kind} {cap}; "
                                 "a request must be at most its limit")
        return self


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


DURATION = r"^[1-9][0-9]*(s|m|h)$"


def duration_seconds(text: str) -> int:
    """`30s`, `10m`, `1h` (DURATION) in seconds."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


class CanaryChecks(Model):
    """What the canary must meet, per interval, from vLLM's own metrics: absolute ceilings and a
    ceiling relative to the stable pods. Every unset check is skipped; no check at all compares the
    latencies with maxRegressionPercent 10."""

    ttft_p95_ms: float | None = Field(None, gt=0, description="Ceiling on the canary's p95 time to first token (ms)")
    itl_p95_ms: float | None = Field(None, gt=0, description="Ceiling on the canary's p95 inter-token latency (ms)")
    e2e_p95_ms: float | None = Field(None, gt=0, description="Ceiling on the canary's p95 end-to-end latency (ms)")
    preemptions_per_minute: float | None = Field(None, ge=0, description="Ceiling on the canary's preemptions "
                                                 "per minute")
    error_rate: float | None = Field(None, ge=0, le=1, description="Ceiling on the canary's share of aborted or "
                                     "failed requests")
    max_regression_percent: float | None = Field(None, ge=0, description="Each latency check also fails when the "
                                                 "canary is this many percent worse than the stable pods")


class Canary(Model):
    """Canary of an engine change: replicas with the new engine hash beside the stable ones, compared
    every interval; promoted after `duration` without too many failed intervals, else rolled back."""

    replicas: int = Field(1, ge=1, le=100)
    """Canary replicas (each needs a spare GPU set of the product)"""
    traffic_percent: int = Field(10, ge=1, le=99, description="Share of the upstream's requests the router "
                                 "sends to the canary (its own Service, <name>-vllm-canary) while it is analysed, "
                                 "whatever the replica counts; the stable Service serves only stable pods")
    duration: str = Field("10m", pattern=DURATION)
    """How long the analysis runs before promoting (e.g. 10m)"""
    interval: str = Field("1m", pattern=DURATION)
    """How often canary and stable are compared; also the metrics window (e.g. 1m)"""
    failure_limit: int = Field(1, ge=0)
    """Failed intervals tolerated; one more rolls back"""
    min_requests: int = Field(10, ge=1)
    """Finished canary requests an interval needs; fewer is a failed check, never a pass"""
    checks: CanaryChecks = Field(default_factory=CanaryChecks)
    """The checks each interval"""


class Rollout(Model):
    """How engine changes roll: Auto, Manual with explicit surge and unavailability, or Canary."""

    strategy: Literal["Auto", "Manual", "Canary"] = Field(
        "Auto", description="Auto: surge when a spare GPU of the product exists, else one at a time; Canary: "
        "first canary replicas compared with the stable ones on serving metrics, then Auto or rolled back"
    )
    canary: Canary | None = None
    """Canary: replicas, traffic share, duration, interval, failure limit and checks"""
    max_surge: int | None = Field(None, ge=0)
    """Manual: extra replicas during a rollout"""
    max_unavailable: int | None = Field(None, ge=0)
    """Manual: replicas that may be down during a rollout"""

    @model_validator(mode="after")
    def _can_progress(self) -> Rollout:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError(ROLLOUT_STUCK)
        return self


ROLLOUT_STUCK = ("maxSurge and maxUnavailable cannot both be 0 (no replica could ever be replaced); "
                 "set maxUnavailable: 1, or maxSurge: 1 if a spare GPU exists")


DURATION_OR_ZERO = r"^[0-9]+(s|m|h)$"


class AutoscalingTargets(Model):
    """What one replica should carry; the replicas asked for are the larger of the two, HPA style."""

    waiting_per_replica: float = Field(5, gt=0, le=10_000, description="Requests waiting in vLLM's queue "
                                       "(vllm:num_requests_waiting) per replica")
    kv_cache_usage: float = Field(0.8, gt=0, le=1, description="KV cache usage (vllm:kv_cache_usage_perc, 0-1) "
                                  "per replica")


class Autoscaling(Model):
    """Replicas follow demand: vLLM's queue and KV usage from Prometheus plus the router's demand for the
    upstream. The operator writes only the Deployment's replicas and status.autoscaling (never spec);
    missing, stale or partial metrics hold the count; it never asks for more replicas than the GPU pool
    can place. With minReplicas 0 an idle upstream goes to zero and the next routed request wakes it
    (the route's coldStart decides what that request gets meanwhile)."""

    min_replicas: int = Field(1, ge=0, le=1000)
    """Fewest replicas; 0 allows scale to zero"""
    max_replicas: int = Field(ge=1, le=1000)
    """Most replicas"""
    targets: AutoscalingTargets = Field(default_factory=AutoscalingTargets)
    """Per-replica targets"""
    scale_up_stabilization: str = Field("30s", pattern=DURATION_OR_ZERO, description="How long the load must "
                                        "ask for more before scaling up (to the lowest reading in that time)")
    max_scale_up_step: int | None = Field(None, ge=1, le=1000, description="Most replicas one scale-up adds (the "
                                          "next step waits until those are Ready); unset: as many as the load "
                                          "asks for, up to maxReplicas and what the GPU pool can place")
    scale_down_delay: str = Field("5m", pattern=DURATION_OR_ZERO, description="How long the load must ask for "
                                  "fewer before scaling down (to the highest reading in that time)")
    scale_to_zero_after: str = Field("10m", pattern=DURATION, description="With minReplicas 0: idle time (nothing "
                                     "waiting or running, no router demand) before going to zero")

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(AUTOSCALING_BOUNDS)
        return self


AUTOSCALING_BOUNDS = ("autoscaling.minReplicas must be <= autoscaling.maxReplicas: raise maxReplicas or lower "
                      "minReplicas")


def duration_or_zero_seconds(text: str) -> int:
    """DURATION_OR_ZERO (`0s`, `30s`, `5m`) in seconds."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


class Routing(Model):
    """How the router spreads this upstream's requests over its replicas (it picks the pod per request)."""

    picker: PickerName | None = Field(None, description="random, round-robin, least-loaded, prefix (approximate "
                                      "prefix-cache affinity, sticky until saturated) or kv-events (the engines' "
                                      f"own KV-cache events; renders --kv-events-config); default {DEFAULT_PICKER}")


class SecretKeyRef(Model):
    """A key of a Secret in the upstream's namespace (read by name; the value is never logged)."""

    name: str = Field(pattern=NAME_PATTERN)
    """Secret name"""
    key: str = Field("api-key", min_length=1)
    """Key within the Secret"""


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


class ProviderPromptCache(Model):
    """Provider prompt caching: what the router does to get cached-input prices."""

    min_prefix_tokens: int | None = Field(None, ge=0, description="OpenAI: shortest cached prefix")
    breakpoints: int | None = Field(None, ge=0, le=4, description="Anthropic: cache_control markers")
    ttl: Literal["5m", "1h"] | None = None
    """Anthropic: cache lifetime, 5m or 1h"""


class GPUUpstreamPricing(Pricing):
    """Dollars per million tokens, and for a self-hosted upstream what its GPUs cost by the hour."""

    gpu_hour_dollars: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="Self-hosted: dollars per GPU-hour (each replica has gpu.count "
        "GPUs), for `oculis cost report`'s allocation basis; the router never reads it")


class GPUUpstreamSpec(Model):
    """A model served by vLLM on a GPU pool (provider vllm), or an external provider."""

    provider: Provider
    """vllm (self-hosted on GPUs), openai, anthropic or openai-compatible"""
    model: str = Field(min_length=1, description="Model id (Hugging Face id for vllm)")
    # self-hosted
    replicas: int | None = Field(None, ge=0, le=1000)
    """Self-hosted: engine replicas (each with gpu.count GPUs)"""
    gpu: GPU | None = None
    """Self-hosted: GPU product and count per replica"""
    node_selector: dict[str, str] | None = None
    """Self-hosted: extra node labels the pods must match"""
    pod_annotations: dict[str, str] | None = Field(None, description="Extra annotations on the engine pods")
    tolerations: list[Toleration] | None = None
    """Self-hosted: extra tolerations"""
    image: str | None = Field(None, min_length=1, max_length=1024, pattern=r"^\S+$")
    """Self-hosted: engine image (default: the pinned vllm/vllm-openai)"""
    resources: Resources | None = None
    """Self-hosted: CPU and memory"""
    model_config_: ModelConfig | None = Field(None, alias="modelConfig")
    """Architecture facts for a model outside the built-in catalog"""
    model_config_from: ModelConfigFrom | None = None
    """The model's Hugging Face config.json from a ConfigMap (instead of modelConfig)"""
    engine: Engine | None = None
    """Self-hosted: vLLM engine settings"""
    adapters: list[Adapter] | None = Field(None, max_length=MAX_ADAPTERS)
    """Self-hosted: LoRA adapters served beside the base model (tiers name them in `adapter`)"""
    traffic: Traffic | None = None
    """What the capacity check plans for"""
    rollout: Rollout | None = None
    """How engine changes roll out"""
    autoscaling: Autoscaling | None = None
    """Self-hosted: replicas follow demand (spec.replicas is then only the count before the first decision)"""
    routing: Routing | None = None
    """Self-hosted: how the router picks the replica of each request"""
    # external
    base_url: str | None = Field(None, alias="baseURL")
    """External: the provider's base URL (default: the provider's public API)"""
    api_key_secret_ref: SecretKeyRef | None = None
    """External: the Secret key holding the API key"""
    prompt_cache: ProviderPromptCache | None = None
    """External: provider prompt caching"""
    pricing: GPUUpstreamPricing | None = None
    """Dollars per million tokens, for the router's cost metrics; gpuHourDollars for cost reports"""
    timeouts: Timeouts | None = None
    """How long the router waits on this upstream: connectSeconds, firstByteSeconds (a stream's first
    chunk, a non-streamed answer's headers) and idleSeconds (between chunks); no cap on a whole stream"""

    @property
    def self_hosted(self) -> bool:
        return self.provider == "vllm"

    @property
    def lora_enabled(self) -> bool:
        """The engine serves LoRA adapters (--enable-lora): `adapters` is set, even empty (so the first adapter
        added or the last removed restarts nothing), or engine.maxLoras is."""
        return self.self_hosted and (self.adapters is not None or (
            self.engine is not None and self.engine.max_loras is not None))

    @property
    def runtime_adapters(self) -> bool:
        """Adapters are loaded through the engine's API, not in the pod template (engine.runtimeLoraUpdating)."""
        return self.lora_enabled and (self.engine is None or self.engine.runtime_lora_updating)

    @field_validator("pod_annotations", "node_selector")
    @classmethod
    def _kubernetes_keys(cls, value: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        # Copied into the pod template as they are: a key (or a node label value) the API server refuses
        # there passed `kubectl apply` and failed only when the operator wrote the Deployment.
        field = "podAnnotations" if info.field_name == "pod_annotations" else "nodeSelector"
        for k, v in (value or {}).items():
            if why := key_problem(k):
                raise ValueError(f"{field}: {why}")
            if field == "nodeSelector" and not re.fullmatch(LABEL_VALUE, v):
                raise ValueError(f"nodeSelector[{k!r}]: {v!r} {LABEL_VALUE_RULE}")
        return value

    @model_validator(mode="after")
    def _shape(self) -> GPUUpstreamSpec:
        # Same rules as CEL_RULES below, for the Python API and the config file.
        if self.self_hosted and self.gpu is None:
            raise ValueError("gpu: a self-hosted (vllm) upstream needs `gpu: {product, count}`")
        if not self.self_hosted and (self.gpu is not None or self.engine is not None):
            raise ValueError("gpu/engine: only self-hosted (vllm) upstreams take `gpu` or `engine`")
        if self.provider == "openai-compatible" and not self.base_url:
            raise ValueError(COMPATIBLE_NEEDS_URL)
        e = self.engine
        if e and e.max_num_seqs and e.max_num_batched_tokens and e.max_num_batched_tokens < e.max_num_seqs:
            raise ValueError("engine.maxNumBatchedTokens must be >= engine.maxNumSeqs (vLLM refuses otherwise)")
        if e and e.preemption_mode == "swap":
            v = vllm_version(self.image or VLLM_IMAGE) or PINNED_VLLM
            raise ValueError(f"{SWAP_MESSAGE} (the engine image {self.image or VLLM_IMAGE} runs vLLM {v[0]}.{v[1]})")
        if e and (removed := removed_flag_problem(e.extra_args, self.image)):
            raise ValueError(removed)
        if self.model_config_ is not None and self.model_config_from is not None:
            raise ValueError(BOTH_MODEL_CONFIGS)
        if self.routing is not None and self.routing.picker is not None and not self.self_hosted:
            raise ValueError(PICKER_EXTERNAL)
        if self.adapters and not self.self_hosted:
            raise ValueError("spec.adapters apply only to provider vllm (the engine loads them); remove them")
        if self.adapters and (why := adapter_problem(self.adapters, e.max_lora_rank if e else None)):
            raise ValueError(why)
        if e and self.runtime_adapters and (why := api_servers_problem(e.extra_args)):
            raise ValueError(why)
        return self


BOTH_MODEL_CONFIGS = ("spec.modelConfig and spec.modelConfigFrom are exclusive: give the architecture once, "
                      "either inline or as the config.json in a ConfigMap")
COMPATIBLE_NEEDS_URL = ("spec.baseURL is required when provider is openai-compatible (it has no public "
                        "default): set baseURL: http://host:8000/v1")
PICKER_EXTERNAL = ("spec.routing.picker applies only to provider vllm (the router picks among its pods); an "
                   "external provider has no replicas to pick from: remove spec.routing.picker")
SWAP_MESSAGE = (
    "engine.preemptionMode: swap is not supported: vLLM V1 always preempts by recompute (swap was removed "
    "with the V0 engine); set preemptionMode: recompute or leave it unset"
)

# CEL rules on `spec` (x-kubernetes-validations): evaluated by the API server at `kubectl apply`.
CEL_RULES: list[dict[str, str]] = [
    {"rule": "self.provider != 'vllm' || has(self.gpu)",
     "message": "spec.gpu is required when provider is vllm: set gpu: {product: H100-80GB, count: 1}",
     "fieldPath": ".gpu"},
    {"rule": "self.provider != 'openai-compatible' || (has(self.baseURL) && size(self.baseURL) > 0)",
     "message": COMPATIBLE_NEEDS_URL, "fieldPath": ".baseURL"},
    {"rule": "self.provider == 'vllm' || (!has(self.gpu) && !has(self.engine))",
     "message": "spec.gpu and spec.engine apply only to provider vllm; remove them for external providers"},
    {"rule": "!has(self.engine) || !has(self.engine.maxNumSeqs) || !has(self.engine.maxNumBatchedTokens) "
             "|| self.engine.maxNumBatchedTokens >= self.engine.maxNumSeqs",
     "message": "spec.engine.maxNumBatchedTokens must be >= spec.engine.maxNumSeqs",
     "fieldPath": ".engine.maxNumBatchedTokens"},
    {"rule": "!has(self.engine) || !has(self.engine.preemptionMode) || self.engine.preemptionMode != 'swap'",
     "message": SWAP_MESSAGE, "fieldPath": ".engine.preemptionMode"},
    {"rule": "!has(self.modelConfig) || !has(self.modelConfigFrom)", "message": BOTH_MODEL_CONFIGS,
     "fieldPath": ".modelConfigFrom"},
    {"rule": "self.provider == 'vllm' || !has(self.routing) || !has(self.routing.picker)",
     "message": PICKER_EXTERNAL, "fieldPath": ".routing.picker"},
    {"rule": "!has(self.rollout) || !has(self.rollout.maxSurge) || !has(self.rollout.maxUnavailable) "
             "|| self.rollout.maxSurge > 0 || self.rollout.maxUnavailable > 0",
     "message": ROLLOUT_STUCK, "fieldPath": ".rollout"},
    {"rule": "!has(self.autoscaling) || !has(self.autoscaling.minReplicas) "
             "|| self.autoscaling.minReplicas <= self.autoscaling.maxReplicas",
     "message": AUTOSCALING_BOUNDS, "fieldPath": ".autoscaling.minReplicas"},
    *ADAPTER_CEL_RULES,
]
NAME_RULE = {"rule": f"size(self.metadata.name) <= {MAX_NAME}",
             "message": f"metadata.name must be at most {MAX_NAME} characters (derived Deployment names add a suffix)"}
NAME_MESSAGE = ("metadata.name must be a DNS-1035 label: lower-case letters, digits and '-', starting with a letter "
                "and ending with a letter or digit (e.g. llama-8b), because the operator names a Service after it")
DNS_NAME_RULE = {"rule": f"self.metadata.name.matches('{DNS_1035}')", "message": NAME_MESSAGE}


class Condition(Model):
    """A status condition, as Kubernetes conventions define it."""

    type: str
    """Ready, CapacityOK, Progressing or Degraded"""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown"""
    reason: str
    """CamelCase reason"""
    message: str = ""
    """What happened, with the numbers and the fix"""
    last_transition_time: str | None = None
    """When status last changed"""
    observed_generation: int | None = None
    """The spec generation this condition describes"""


class Capacity(Model):
    """The KV-cache plan for the current spec, per GPU."""

    gpu_memory_bytes: int
    """Memory of one GPU"""
    weights_bytes_per_gpu: int
    """Model weights on each GPU"""
    kv_bytes_per_token: int
    """KV cache bytes one token takes on each GPU"""
    kv_cache_tokens: int
    """Tokens the KV cache holds"""
    max_concurrency: int
    """Sequences of the planned length that fit at once"""
    planned_tokens: int | None = None
    """KV tokens the plan expects the engine to report"""
    observed_tokens: int | None = None
    """KV tokens the running engines report (vllm:cache_config_info num_gpu_blocks, the smallest replica)"""
    error_percent: float | None = None
    """(planned - observed) / observed in %; above 5 raises CapacityOK reason PlanDrift"""


class CanaryCheck(Model):
    """One check of the last canary interval: canary against stable and the limit."""

    name: str
    """ttftP95Ms, itlP95Ms, e2eP95Ms, preemptionsPerMinute or errorRate"""
    canary: float | None = None
    """The canary's figure (none: no samples)"""
    stable: float | None = None
    """The stable pods' figure"""
    limit: float | None = None
    """The ceiling the canary had to meet"""
    ok: bool
    """Whether the check passed"""
    message: str = ""
    """Why it failed"""


class CanaryStatus(Model):
    """The canary analysis of one spec generation."""

    generation: int
    """The spec generation canaried"""
    engine_hash: str
    """The canary's engine hash"""
    phase: Literal["WaitingForGPUs", "Analyzing", "Promoted", "RolledBack"]
    """Where the canary is"""
    decision: Literal["Promote", "Rollback", "Continue", "Inconclusive"] | None = None
    """The last decision"""
    started_at: str | None = None
    """When the canary replicas were created"""
    last_check_at: str | None = None
    """When the last interval was analysed"""
    intervals: int = 0
    """Intervals analysed"""
    failed_intervals: int = 0
    """Intervals with a failed check"""
    canary_requests: float | None = None
    """Finished canary requests in the last interval"""
    checks: list[CanaryCheck] = Field(default_factory=list)
    """The last interval's checks"""
    message: str = ""
    """The decision in words, with the figures"""
    summary: str = ""
    """Printer column, e.g. 3/10 ttft ok itl ok"""


class SpeculativeStatus(Model):
    """Speculative decoding as measured over the window."""

    acceptance_rate: float | None = None
    """Accepted / draft tokens over the window"""
    mean_accepted_length: float | None = None
    """1 + accepted tokens per draft: tokens each verification step yields"""
    draft_tokens: float | None = None
    """Draft tokens proposed in the window"""
    window: str
    """The window, e.g. 60s"""
    decision: Literal["Keep", "Watching", "Disable", "Disabled", "TooFewTokens", "NoData"]
    """Keep, Watching (below the threshold since lowSince), Disable(d), TooFewTokens or NoData"""
    low_since: str | None = None
    """Since when the acceptance has been below the threshold"""
    disabled_generation: int | None = None
    """The spec generation whose speculation the guard turned off"""
    message: str = ""
    """The decision with the figures"""


class AutoscalingStatus(Model):
    """The last autoscaling decision and the stabilisation state the next one starts from."""

    desired_replicas: int
    """Replicas asked of the Deployment (printer column DESIRED)"""
    reason: str
    """Why: ScaleUp, ScaleDown, Steady, StabilizingUp, WaitingForGPUs, ScaledToZero, MetricsMissing, ..."""
    message: str = ""
    """The figures behind it"""
    above_since: str | None = None
    """Since when the load has asked for more"""
    up_target: int | None = None
    """Lowest count asked for since aboveSince"""
    below_since: str | None = None
    """Since when the load has asked for fewer"""
    down_target: int | None = None
    """Highest count asked for since belowSince"""
    idle_since: str | None = None
    """Since when nothing waits or runs and the router has no demand"""


class GPUUpstreamStatus(Model):
    """What the operator did and sees."""

    observed_generation: int | None = None
    """The spec generation last reconciled"""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, CapacityOK, Progressing and Degraded"""
    replicas: int | None = None
    """Replicas of the engine Deployment"""
    ready_replicas: int | None = None
    """Replicas that are Ready"""
    updated_replicas: int | None = None
    """Replicas on the current pod template"""
    capacity: Capacity | None = None
    """The KV-cache plan"""
    engine_hash: str | None = Field(None, description="Hash of the engine settings every ready replica runs")
    desired_engine_hash: str | None = None
    """Hash of the engine settings the spec asks for"""
    endpoint: str | None = None
    """In-cluster URL of the OpenAI-compatible API"""
    served_model: str | None = None
    """The name every ready replica answers, the router's model for it: the upstream's own name, kept across
    spec.model changes"""
    gpu: str | None = Field(None, description="Printer column: product x count")
    canary: CanaryStatus | None = None
    """The canary analysis of an engine change: phase, last decision and its figures"""
    speculative: SpeculativeStatus | None = None
    """Measured speculative-decoding acceptance and what the guard decided"""
    rollout: str | None = Field(None, description="What the rollout is doing or waiting for")
    autoscaling: AutoscalingStatus | None = None
    """spec.autoscaling: the last decision, its figures and the stabilisation state"""
    adapters: list[AdapterStatus] | None = None
    """spec.adapters on the running engines: per adapter, the ready replicas holding it and why not all do"""
    adapters_ready: str | None = Field(None, description="Printer column ADAPTERS: adapters on every ready "
                                       "replica / adapters declared")


class GPUUpstream(Model):
    """A model served by vLLM on a GPU pool, or an external provider (OpenAI, Anthropic, any
    OpenAI-compatible API). For provider vllm the operator plans the KV cache, refuses a change that
    cannot fit before any pod restarts, and renders a Deployment, Service and PodDisruptionBudget
    named <name>-vllm, which it keeps as rendered; InferenceRoutes send traffic to it by name."""

    api_version: Literal["oculis.dev/v1alpha1"] = "oculis.dev/v1alpha1"
    kind: Literal["GPUUpstream"] = "GPUUpstream"
    name: str = Field(pattern=DNS_1035, max_length=MAX_NAME)
    spec: GPUUpstreamSpec
