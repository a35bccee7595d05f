"""A Hugging Face `config.json`, as users have it, -> the ModelConfig the capacity plan needs. Pure.

Reads the architecture (dense, MoE, MLA, sliding-window layers) and `quantization_config`, and counts
the parameters the way vLLM loads them (the MTP layers of DeepSeek-V3 are not loaded without
speculative decoding). Architectures whose KV cache is not attention pages (Mamba, linear attention)
are refused with a one-line reason instead of being given a wrong number.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from oculis.base import format_errors
from oculis.engine import ModelConfig


class HFConfigError(ValueError):
    """One line: the field, the value, the fix."""


# model_type values whose layers keep state that is not attention KV pages (vLLM's Mamba / linear
# attention groups); the plan does not model them.
NOT_MODELLED = {"mamba", "mamba2", "jamba", "falcon_h1", "nemotron_h", "zamba2", "bamba", "granitemoehybrid",
                "qwen3_next", "minimax", "minimax_m1", "plamo2", "lfm2", "kimi_linear", "llama4"}
# Model types whose HF config class ties the output head to the embeddings unless told otherwise.
TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text"}
# vLLM's --dtype auto serves a float32 checkpoint in 16 bit (it downcasts), so every dtype is 2 bytes served.
# Values a config.json may leave out because the model's HF config class supplies them.
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window_pattern": 6,
                    "tie_word_embeddings": True, "num_key_value_heads": 16, "head_dim": 256},
    "gemma2": {"vocab_size": 256000, "max_position_embeddings": 8192, "tie_word_embeddings": True},
}
DTYPE_BYTES = {"float32": 2, "float": 2, "bfloat16": 2, "float16": 2, "half": 2}


def parse(text: str, source: str = "config.json") -> ModelConfig:
    """config.json text -> ModelConfig; HFConfigError naming the field otherwise."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HFConfigError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}); give the model's "
                            "config.json as downloaded from Hugging Face") from None
    if not isinstance(raw, dict):
        raise HFConfigError(f"{source}: the top level is {type(raw).__name__}, not an object; give the model's "
                            "config.json")
    return from_dict(raw, source)


def _int(cfg: dict[str, Any], key: str, source: str, default: int | None = None) -> int:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        if value is None:
            raise HFConfigError(f"{source}: {key} is missing; a decoder config.json has it (is this the model's "
                                "config.json, not generation_config.json or tokenizer_config.json?)")
        raise HFConfigError(f"{source}: {key} {value!r} is not a positive integer")
    return value


def _opt(cfg: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def quantization(cfg: dict[str, Any], source: str) -> str | None:
    """The checkpoint's weight format from `quantization_config` (None: unquantized)."""
    q = cfg.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise HFConfigError(f"{source}: quantization_config is {type(q).__name__}, not an object")
    method = str(q.get("quant_method", "")).lower()
    bits = q.get("bits", q.get("w_bit"))
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    if method in ("awq", "awq_marlin"):
        return "awq"
    if method in ("gptq", "gptq_marlin"):
        return "int8" if bits == 8 else "gptq"
    if method == "mxfp4":
        return "mxfp4"
    if method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if algo in ("FP8", "NVFP4"):
            return "fp8" if algo == "FP8" else "nvfp4"
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)] \
            if isinstance(groups, dict) else []
        if weights:
            w = weights[0]
            num_bits, kind = w.get("num_bits"), str(w.get("type", "int"))
            if num_bits == 8:
                return "fp8" if kind == "float" else "int8"
            if num_bits == 4:
                return "nvfp4" if kind == "float" else "w4a16"
    raise HFConfigError(f"{source}: quantization_config.quant_method {method or None!r}"
                        f"{f' ({bits} bits)' if bits else ''} is not modelled; supported: fp8, awq, gptq (4/8 bit), "
                        "compressed-tensors (w8a8, fp8, w4a16, nvfp4), modelopt (FP8, NVFP4), mxfp4")


def _layer_kinds(cfg: dict[str, Any], layers: int, source: str) -> tuple[int | None, int | None]:
    """(sliding_window, full-attention layers) from the config's attention layout."""
    window = _opt(cfg, "sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = {str(k) for k in layer_types}
        other = kinds - {"full_attention", "sliding_attention"}
        if other:
            raise HFConfigError(f"{source}: layer_types has {sorted(other)} layers (state that is not attention KV); "
                                "the capacity plan does not model them, so it gives no KV estimate for this model")
        full = sum(1 for k in layer_types if k == "full_attention")
        return (window, full) if window and full < layers else (None, None)
    if not window or cfg.get("use_sliding_window") is False:
        return None, None
    model_type = str(cfg.get("model_type", ""))
    if model_type == "gemma2":  # sliding and global layers alternate (HF Gemma2: every other layer)
        return window, layers // 2
    pattern = _opt(cfg, "sliding_window_pattern")
    if pattern:  # Gemma 3: every pattern-th layer is global
        return window, layers // pattern
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        # Qwen applies the window only from max_window_layers on
        first = cfg.get("max_window_layers", layers)
        full = min(layers, first if isinstance(first, int) else layers)
        return (window, full) if full < layers else (None, None)
    return window, 0  # Mistral-7B-v0.1 style: every layer slides


def params(cfg: dict[str, Any], source: str) -> float:
    """Parameters vLLM loads (weights and embeddings; biases and norms are a rounding error)."""
    h = _int(cfg, "hidden_size", source)
    layers = _int(cfg, "num_hidden_layers", source)
    heads = _int(cfg, "num_attention_heads", source)
    kv = _int(cfg, "num_key_value_heads", source, heads)
    head_dim = _opt(cfg, "head_dim") or h // heads
    vocab = _int(cfg, "vocab_size", source)
    tied = bool(cfg.get("tie_word_embeddings", str(cfg.get("model_type", "")) in TIED_BY_DEFAULT))
    total = vocab * h * (1 if tied else 2) + h  # embeddings, lm_head, final norm
    if cfg.get("kv_lora_rank"):  # MLA (DeepSeek-V2/V3, Kimi)
        rope, nope = _int(cfg, "qk_rope_head_dim", source), _int(cfg, "qk_nope_head_dim", source)
        v_dim, kv_rank = _int(cfg, "v_head_dim", source), _int(cfg, "kv_lora_rank", source)
        q_rank = _opt(cfg, "q_lora_rank")
        q = h * q_rank + q_rank * heads * (nope + rope) if q_rank else h * heads * (nope + rope)
        attn = q + h * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * h
    else:
        attn = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h
    inter = _opt(cfg, "intermediate_size") or 4 * h
    experts = _opt(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    dense_mlp = 3 * h * inter
    if experts:
        expert_inter = _opt(cfg, "moe_intermediate_size") or inter
        shared = (_opt(cfg, "n_shared_experts") or 0) * 3 * h * expert_inter \
            + 3 * h * (_opt(cfg, "shared_expert_intermediate_size") or 0)
        moe_mlp = experts * 3 * h * expert_inter + shared + h * experts
        dense_layers = cfg.get("first_k_dense_replace") or 0
        sparse = layers - (dense_layers if isinstance(dense_layers, int) else 0)
        mlp = sparse * moe_mlp + (layers - sparse) * dense_mlp
    else:
        mlp = layers * dense_mlp
    return float(total + layers * (attn + 2 * h) + mlp + vision_params(cfg))


def vision_params(cfg: dict[str, Any]) -> int:
    """A multimodal checkpoint's vision tower (ViT: attention 4 h^2 + MLP 2 h x I per layer) and its
    projector to the text width; vLLM loads it with the language model."""
    vision = cfg.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    vh = _opt(vision, "hidden_size")
    layers = _opt(vision, "num_hidden_layers", "depth")
    if not vh or not layers:
        return 0
    inter = _opt(vision, "intermediate_size") or 4 * vh
    text_h = _opt(cfg, "hidden_size") or vh
    return layers * (4 * vh * vh + 2 * vh * inter) + vh * text_h


def from_dict(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
    cfg = raw
    text = raw.get("text_config")
    if "num_hidden_layers" not in raw and isinstance(text, dict):  # multimodal wrappers (Gemma 3, Llava...)
        cfg = {**text, "quantization_config": raw.get("quantization_config"),
               "model_type": text.get("model_type", raw.get("model_type")), "vision_config": raw.get("vision_config"),
               "tie_word_embeddings": text.get("tie_word_embeddings", raw.get("tie_word_embeddings"))}
        cfg = {k: v for k, v in cfg.items() if v is not None}
    model_type = str(cfg.get("model_type", ""))
    cfg = {**CLASS_DEFAULTS.get(model_type, {}), **cfg}
    if model_type in NOT_MODELLED or cfg.get("attn_type_list") or cfg.get("layers_block_type"):
        raise HFConfigError(f"{source}: model_type {model_type!r} keeps per-request state that is not attention KV "
                            "pages (Mamba / linear / chunked attention); the capacity plan does not model it and gives "
                            "no KV estimate: measure it instead (oculis capacity check --log on the engine's start-up "
                            "log)")
    layers = _int(cfg, "num_hidden_layers", source)
    h = _int(cfg, "hidden_size", source)
    heads = _int(cfg, "num_attention_heads", source)
    kv = _int(cfg, "num_key_value_heads", source, heads)
    max_pos = _int(cfg, "max_position_embeddings", source, _opt(cfg, "seq_length", "n_positions"))
    window, full_layers = _layer_kinds(cfg, layers, source)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = _int(cfg, "kv_lora_rank", source) + _int(cfg, "qk_rope_head_dim", source)
    experts = _opt(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    fields: dict[str, Any] = {
        "params_billions": params(cfg, source) / 1e9, "num_layers": layers, "hidden_size": h,
        "num_attention_heads": heads, "num_kv_heads": kv,
        "head_dim": _opt(cfg, "head_dim") or (_opt(cfg, "qk_nope_head_dim") or 0) + (_opt(cfg, "qk_rope_head_dim") or 0)
        if mla else _opt(cfg, "head_dim") or h // heads,
        "vocab_size": _int(cfg, "vocab_size", source), "max_position_embeddings": max_pos,
        "dtype_bytes": DTYPE_BYTES.get(dtype, 2), "mla_latent_dim": mla,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT)),
        "intermediate_size": _opt(cfg, "intermediate_size"),
        "num_experts": experts, "num_experts_per_tok": _opt(cfg, "num_experts_per_tok") if experts else None,
        "moe_intermediate_size": (_opt(cfg, "moe_intermediate_size") or _opt(cfg, "intermediate_size"))
        if experts else None,
        "quantization": quantization(cfg, source), "sliding_window": window, "full_attention_layers": full_layers,
    }
    try:
        return ModelConfig.model_validate(fields)
    except ValidationError as exc:
        raise HFConfigError(f"{source}: " + format_errors(exc, "modelConfig").replace("\n", "; ")) from None


def config_map_text(spec: dict[str, Any], read: Any, namespace: str) -> tuple[str | None, str | None]:
    """(config.json text, None) for a spec's `modelConfigFrom`, or (None, why it cannot be read); (None, None)
    when the spec has none. `read(name)` returns the ConfigMap or None (the shell's API call)."""
    ref = (spec.get("modelConfigFrom") or {}).get("configMapKeyRef") or {}
    name, key = ref.get("name"), ref.get("key", "config.json")
    if not name:
        return None, None
    cm = read(name)
    if cm is None:
        return None, (f"spec.modelConfigFrom: ConfigMap {name!r} not found in namespace {namespace}; create it "
                      f"with `kubectl create configmap {name} --from-file={key}=config.json`")
    data = cm.get("data") or {}
    if key not in data:
        return None, (f"spec.modelConfigFrom: ConfigMap {name!r} has no key {key!r} (it has: "
                      f"{', '.join(sorted(data)) or 'none'}); set configMapKeyRef.key or add the key")
    return str(data[key]), None
