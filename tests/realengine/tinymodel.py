"""Builds the real-engine tier's tiny model from local text, with no model hub.

Run with the engine virtualenv's Python (it has tokenizers, transformers and torch; the project's own
environment has none of them): ``python tests/realengine/tinymodel.py OUT_DIR``. It trains a byte-level
BPE tokenizer on the Python standard library's sources, builds a 2-layer LlamaForCausalLM with random
weights from a fixed seed, and saves both with a ChatML chat template, so ``vllm serve OUT_DIR`` answers
completions and chat. The output is gibberish; token counts, timings, queueing, KV usage and logprobs are
the real engine's. Deterministic for a given standard library, so a cache keyed on this file is sound.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# ChatML, as Qwen-style models ship it: the engine renders it for /v1/chat/completions.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{{ (message['content'] if message['content'] is string else '') + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TRAINING_TEXT_BYTES = 4_000_000


def stdlib_text() -> Iterator[str]:
    """The first few MB of the standard library's sources, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    budget = TRAINING_TEXT_BYTES
    for path in sorted(root.glob("*.py")):
        if budget <= 0:
            return
        text = path.read_text(encoding="utf-8", errors="replace")
        budget -= len(text)
        yield text


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(stdlib_text(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=2048,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    config.dtype = torch.bfloat16
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    # generation_config.json would carry eos/pad ids only; vLLM reads them from config.json too.
    (out / "oculis-tiny-model.json").write_text(
        json.dumps({"vocab_size": len(tokenizer), "parameters": sum(p.numel() for p in model.parameters())})
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/realengine/tinymodel.py OUT_DIR")
    build(Path(sys.argv[1]))
