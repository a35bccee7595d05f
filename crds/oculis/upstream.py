"""GPUUpstream: a model served by vLLM on a GPU pool, or an external provider.

The CRD schema (`crds/gpuupstreams.oculis.dev.yaml`) is generated from these models by
`oculis.crdgen`; CEL rules that span fields live in `CEL_RULES` next to the spec they guard. The
spec's parts have their own modules: `placement` (GPU, tolerations, resources), `engine` (vLLM
settings, model facts, traffic), `rollout`, `autoscaling`; the status is in `upstream_status`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from oculis.adapters import ADAPTER_CEL_RULES, MAX_ADAPTERS, Adapter, adapter_problem, api_servers_problem
from oculis.autoscaling import AUTOSCALING_BOUNDS, Autoscaling
from oculis.base import Model
from oculis.engine import Engine as Engine  # re-exported: oculis_sim imports it from here
from oculis.engine import ModelConfig as ModelConfig  # re-exported: oculis_sim imports it from here
from oculis.engine import ModelConfigFrom, Traffic
from oculis.engine import Speculative as Speculative  # re-exported: oculis_sim imports it from here
from oculis.engine_access import Access
from oculis.formats import LABEL_VALUE, LABEL_VALUE_RULE, key_problem
from oculis.placement import GPU, Resources, Toleration
from oculis.rollout import ROLLOUT_STUCK, Rollout
from oculis.router_upstream import DEFAULT_PICKER, NAME_PATTERN, PickerName, Pricing, Provider, Timeouts
from oculis.vllm_flags import PINNED_VLLM, VLLM_IMAGE, removed_flag_problem, vllm_version

# Kubernetes names of the Deployment/Service we derive ("<name>-vllm") must stay within 63 chars.
MAX_NAME = 52
# A Service name is a DNS-1035 label (no dots, starts with a letter), so an upstream's name must be one.
DNS_1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class Routing(Model):
    """How the router spreads this upstream's requests over its replicas (it picks the pod per request)."""

    picker: PickerName | None = Field(None, description="random, round-robin, least-loaded, prefix (approximate "
                                      "prefix-cache affinity, sticky until saturated) or kv-events (the engines' "
                                      f"own KV-cache events; renders --kv-events-config); default {DEFAULT_PICKER}")
    tokenizer: str | None = Field(None, min_length=1, max_length=4096, description="The model's tokenizer as an "
                                  "absolute path inside the router pod (its directory with tokenizer.json and "
                                  "tokenizer_config.json, or the tokenizer.json; mount it with the chart's "
                                  "router.extraVolumes/extraVolumeMounts): the prefix pickers then hash the model's "
                                  "own token ids, so kv-events matches a real vLLM engine's KV events. The operator "
                                  "cannot see the router's files: a path missing there is refused by the router's "
                                  "reload, which keeps its last good config")


class SecretKeyRef(Model):
    """A key of a Secret in the upstream's namespace (read by name; the value is never logged)."""

    name: str = Field(pattern=NAME_PATTERN)
    """Secret name"""
    key: str = Field("api-key", min_length=1)
    """Key within the Secret"""


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
    access: Access | None = None
    """Self-hosted: who may call the engine (its API key; default on)"""
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
    def engine_api_key(self) -> bool:
        """The engine takes an API key (spec.access.apiKey, default true)."""
        return self.self_hosted and (self.access is None or self.access.api_key)

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
        if self.routing is not None and self.routing.tokenizer is not None:
            if not self.self_hosted:
                raise ValueError(TOKENIZER_EXTERNAL)
            if not self.routing.tokenizer.startswith("/"):
                raise ValueError(f"{TOKENIZER_RELATIVE} (got {self.routing.tokenizer!r})")
        if self.access is not None and not self.self_hosted:
            raise ValueError(ACCESS_EXTERNAL)
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
TOKENIZER_EXTERNAL = ("spec.routing.tokenizer applies only to provider vllm (the router hashes the prompt to pick "
                      "among its pods); an external provider has none: remove spec.routing.tokenizer")
TOKENIZER_RELATIVE = ("spec.routing.tokenizer must be an absolute path inside the router pod, e.g. "
                      "/tokenizers/llama-8b (mounted with the chart's router.extraVolumeMounts)")
ACCESS_EXTERNAL = ("spec.access applies only to provider vllm (the operator keys the engine it runs); an external "
                   "provider's key is spec.apiKeySecretRef: remove spec.access")
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
    {"rule": "self.provider == 'vllm' || !has(self.routing) || !has(self.routing.tokenizer)",
     "message": TOKENIZER_EXTERNAL, "fieldPath": ".routing.tokenizer"},
    {"rule": "self.provider == 'vllm' || !has(self.access)", "message": ACCESS_EXTERNAL, "fieldPath": ".access"},
    {"rule": "!has(self.routing) || !has(self.routing.tokenizer) || self.routing.tokenizer.startsWith('/')",
     "message": TOKENIZER_RELATIVE, "fieldPath": ".routing.tokenizer"},
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


class GPUUpstream(Model):
    """A model served by vLLM on a GPU pool, or an external provider (OpenAI, Anthropic, any
    OpenAI-compatible API). For provider vllm the operator plans the KV cache, refuses a change that
    cannot fit before any pod restarts, and renders a Deployment, Service and PodDisruptionBudget
    named <name>-vllm, which it keeps as rendered; InferenceRoutes send traffic to it by name."""

    api_version: Literal["oculis.dev/v1alpha1"] = "oculis.dev/v1alpha1"
    kind: Literal["GPUUpstream"] = "GPUUpstream"
    name: str = Field(pattern=DNS_1035, max_length=MAX_NAME)
    spec: GPUUpstreamSpec
