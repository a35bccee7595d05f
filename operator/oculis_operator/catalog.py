"""Built-in architecture facts for common models, keyed by Hugging Face id. Data only.

Every figure is from the model's `config.json` on Hugging Face (as quoted in
../shared/notes/vllm-engine.md section 7: oumi `configs/recipes/llama3_1/README.md`, tenstorrent/tt-metal
`models/demos/deepseek_v3/reference/README_WEIGHTS.md`); parameter counts from the model cards.
Models not listed need `spec.modelConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass

from oculis.engine import ModelConfig


@dataclass(frozen=True)
class Entry:
    config: ModelConfig
    source: str


def _m(params: float, layers: int, hidden: int, heads: int, kv: int, head_dim: int, vocab: int, max_pos: int,
       inter: int, tied: bool = False, mla: int | None = None, experts: tuple[int, int, int] | None = None,
       quantization: str | None = None, window: tuple[int, int] | None = None) -> ModelConfig:
    """`experts`: (routed experts, experts per token, expert width); `window`: (sliding window, full-attention
    layers)."""
    moe = dict(zip(("num_experts", "num_experts_per_tok", "moe_intermediate_size"), experts or (None,) * 3,
                   strict=True))
    sliding = dict(zip(("sliding_window", "full_attention_layers"), window or (None, None), strict=True))
    return ModelConfig.model_validate(dict(
        params_billions=params, num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv,
        head_dim=head_dim, vocab_size=vocab, max_position_embeddings=max_pos, intermediate_size=inter,
        tie_word_embeddings=tied, mla_latent_dim=mla, quantization=quantization, **moe, **sliding))


# tests/fixtures/hf-configs holds the config.json files; a test checks every entry against them.
_LLAMA31 = "HF meta-llama/Llama-3.1-{}/config.json; params from the model card"
CATALOG: dict[str, Entry] = {
    "meta-llama/Llama-3.1-8B-Instruct": Entry(_m(8.03, 32, 4096, 32, 8, 128, 128256, 131072, 14336),
                                              _LLAMA31.format("8B")),
    "meta-llama/Llama-3.1-70B-Instruct": Entry(_m(70.55, 80, 8192, 64, 8, 128, 128256, 131072, 28672),
                                               _LLAMA31.format("70B")),
    "meta-llama/Llama-3.2-1B-Instruct": Entry(_m(1.24, 16, 2048, 32, 8, 64, 128256, 131072, 8192, tied=True),
                                              "HF meta-llama/Llama-3.2-1B/config.json (tied embeddings)"),
    "meta-llama/Llama-3.2-3B-Instruct": Entry(_m(3.21, 28, 3072, 24, 8, 128, 128256, 131072, 8192, tied=True),
                                              "HF meta-llama/Llama-3.2-3B/config.json (tied embeddings)"),
    "Qwen/Qwen2.5-7B-Instruct": Entry(_m(7.62, 28, 3584, 28, 4, 128, 152064, 32768, 18944),
                                      "HF Qwen/Qwen2.5-7B-Instruct/config.json"),
    "Qwen/Qwen2.5-0.5B-Instruct": Entry(_m(0.49, 24, 896, 14, 2, 64, 151936, 32768, 4864, tied=True),
                                        "HF Qwen/Qwen2.5-0.5B-Instruct/config.json (tied embeddings)"),
    "meta-llama/Llama-3.3-70B-Instruct": Entry(_m(70.55, 80, 8192, 64, 8, 128, 128256, 131072, 28672),
                                               "HF meta-llama/Llama-3.3-70B-Instruct/config.json (as 3.1-70B)"),
    "Qwen/Qwen2.5-72B-Instruct": Entry(_m(72.7, 80, 8192, 64, 8, 128, 152064, 32768, 29568),
                                       "HF Qwen/Qwen2.5-72B-Instruct/config.json"),
    "Qwen/Qwen3-8B": Entry(_m(8.19, 36, 4096, 32, 8, 128, 151936, 40960, 12288), "HF Qwen/Qwen3-8B/config.json"),
    "Qwen/Qwen3-32B": Entry(_m(32.76, 64, 5120, 64, 8, 128, 151936, 40960, 25600), "HF Qwen/Qwen3-32B/config.json"),
    "Qwen/Qwen3-30B-A3B": Entry(_m(30.53, 48, 2048, 32, 4, 128, 151936, 40960, 6144, experts=(128, 8, 768)),
                                "HF Qwen/Qwen3-30B-A3B/config.json"),
    "mistralai/Mistral-Small-24B-Instruct-2501": Entry(_m(23.57, 40, 5120, 32, 8, 128, 131072, 32768, 32768),
                                                       "HF mistralai/Mistral-Small-24B-Instruct-2501/config.json"),
    # MXFP4 experts (attention, router, embeddings bf16); sliding window 128 on every other layer
    "openai/gpt-oss-20b": Entry(_m(20.91, 24, 2880, 64, 8, 64, 201088, 131072, 2880, experts=(32, 4, 2880),
                                   quantization="mxfp4", window=(128, 12)), "HF openai/gpt-oss-20b/config.json"),
    "openai/gpt-oss-120b": Entry(_m(116.8, 36, 2880, 64, 8, 64, 201088, 131072, 2880, experts=(128, 4, 2880),
                                    quantization="mxfp4", window=(128, 18)), "HF openai/gpt-oss-120b/config.json"),
    # text_config with HF's class defaults (vocab 262208, 5:1 sliding/global); the SigLIP tower counted
    "google/gemma-3-27b-it": Entry(_m(27.43, 62, 5376, 32, 16, 128, 262208, 131072, 21504, tied=True,
                                      window=(1024, 10)), "HF google/gemma-3-27b-it/config.json"),
    "Qwen/Qwen3-0.6B": Entry(_m(0.596, 28, 1024, 16, 8, 128, 151936, 40960, 3072, tied=True),
                             "HF Qwen/Qwen3-0.6B/config.json (tied embeddings)"),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": Entry(_m(46.7, 32, 4096, 32, 8, 128, 32000, 32768, 14336,
                                                     experts=(8, 2, 14336)),
                                                  "HF mistralai/Mixtral-8x7B-Instruct-v0.1/config.json"),
    # MLA: one latent of kv_lora_rank 512 + qk_rope_head_dim 64 = 576 per layer, not split by TP. The FP8
    # checkpoint's embeddings and lm_head are bf16; the MTP layer is not loaded without speculation.
    "deepseek-ai/DeepSeek-V3": Entry(_m(671, 61, 7168, 128, 128, 192, 129280, 163840, 18432, mla=576,
                                        experts=(256, 8, 2048), quantization="fp8"),
                                     "HF deepseek-ai/DeepSeek-V3/config.json (FP8 checkpoint, 1 MTP layer)"),
}


def lookup(model: str, inline: ModelConfig | None = None) -> ModelConfig:
    """`spec.modelConfig` wins; otherwise the catalog; otherwise a KeyError naming the fix."""
    if inline is not None:
        return inline
    entry = CATALOG.get(model)
    if entry is None:
        raise KeyError(f"model {model!r} is not in the built-in catalog; add spec.modelConfig with its "
                       f"architecture (from its config.json), or use one of: {', '.join(sorted(CATALOG))}")
    return entry.config
