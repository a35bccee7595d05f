"""GPU memory of LoRA serving (`--enable-lora`), for the capacity plan. Pure.

vLLM 0.32 wraps every LoRA target linear layer at model load and preallocates, per layer and slice,
`lora_a_stacked` (max_loras, 1, max_lora_rank, input_size) and `lora_b_stacked` (max_loras, 1,
output_size, max_lora_rank) in lora_dtype (auto: the model's 16-bit dtype), whatever adapters are
loaded (vllm/lora/layers/base_linear.py `create_lora_weights`). With tensor parallelism a
column-parallel layer (q/k/v, gate/up) keeps lora_a whole and splits lora_b's output; a row-parallel
one (o, down) splits lora_a's input and keeps lora_b whole (fully_sharded_loras off, the default).
These buffers are allocated with the weights, so vLLM's "Model loading took" counts them and the
plan adds them to the weights.

Target modules planned: attention q, k, v, o and MLP gate, up, down of every layer (what vLLM
wraps for a Llama/Qwen-style model; embeddings and lm_head are not LoRA targets by default). MoE
experts are planned as one dense MLP of moe_intermediate_size x experts (an estimate).

At run time each wrapped layer's shrink step takes a float32 buffer (slices, tokens, rank)
(vllm/lora/punica_wrapper/punica_gpu.py `add_lora_linear`): at most 3 slices (q, k, v) x
maxNumBatchedTokens x maxLoraRank x 4 bytes alive at once, added to the activation peak. The punica
index tensors (a few int64 per batched token) are below a MiB and not planned.
"""

from __future__ import annotations

from oculis.adapters import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS
from oculis.engine import Engine, ModelConfig

LORA_DTYPE_BYTES = 2  # lora_dtype auto = the model's 16-bit dtype
SHRINK_SLICES = 3  # q, k, v: the widest merged layer
SHRINK_BYTES = 4  # the shrink buffer is float32


def intermediate_size(model: ModelConfig) -> int:
    """The MLP width; estimated from the parameter count when the config leaves it out (linear
    parameters per layer less attention, over the three h x I matrices)."""
    if model.num_experts and model.moe_intermediate_size:
        return model.moe_intermediate_size * model.num_experts
    if model.intermediate_size:
        return model.intermediate_size
    h, d = model.hidden_size, model.head_dim
    embed = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    per_layer = (model.params_billions * 1e9 - embed) / model.num_layers
    attention = 2 * h * model.num_attention_heads * d + 2 * h * model.num_kv_heads * d
    return max(1, round((per_layer - attention) / (3 * h)))


def lora_weight_elements_per_slot(model: ModelConfig, tp: int, rank: int) -> int:
    """Elements of one adapter slot at `rank` on one GPU, over all layers."""
    h, q, kv = model.hidden_size, model.num_attention_heads * model.head_dim, model.num_kv_heads * model.head_dim
    inter = intermediate_size(model)
    whole = 3 * h + h + 2 * h + h  # lora_a of q,k,v and gate,up (input h); lora_b of o and down (output h)
    split = (q + 2 * kv) + q + 2 * inter + inter  # lora_b of q,k,v and gate,up; lora_a of o and down
    return model.num_layers * rank * (whole + split // tp)


def lora_weight_bytes(model: ModelConfig, tp: int, engine: Engine) -> int:
    """The preallocated adapter buffers per GPU: maxLoras slots at maxLoraRank."""
    slots = engine.max_loras or DEFAULT_MAX_LORAS
    rank = engine.max_lora_rank or DEFAULT_MAX_LORA_RANK
    return slots * lora_weight_elements_per_slot(model, tp, rank) * LORA_DTYPE_BYTES


def lora_activation_bytes(engine: Engine, batched_tokens: int) -> int:
    """The shrink step's float32 buffer at a full step of `batched_tokens`."""
    rank = engine.max_lora_rank or DEFAULT_MAX_LORA_RANK
    return SHRINK_SLICES * batched_tokens * rank * SHRINK_BYTES
