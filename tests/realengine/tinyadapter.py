"""Builds a tiny LoRA adapter for the tier's tiny model, in PEFT's on-disk layout, with no hub and no `peft`.

Run with the engine virtualenv's Python (torch and safetensors; the project's environment has neither):
``python tests/realengine/tinyadapter.py MODEL_DIR OUT_ROOT NAME:RANK:SEED ...`` (one folder per adapter
under OUT_ROOT). It writes what
`PeftModel.save_pretrained` writes for a LoRA on a Llama model's attention (PEFT's default targets,
q_proj and v_proj): `adapter_config.json` and `adapter_model.safetensors` with the tensors
`base_model.model.model.layers.<i>.self_attn.<q|v>_proj.lora_<A|B>.weight` shaped (r, in) and (out, r).
PEFT initialises B to zero (a no-op until trained); here B is random like A, so the adapter changes the
model's answers, which is what a test of "the adapter is applied" needs. Deterministic for a seed.
Checked once by hand with peft 0.21.2 (not a dependency): its `get_peft_model(...).save_pretrained` writes
the same tensor names and shapes, `PeftModel.from_pretrained` loads this adapter without a warning, and
transformers + peft answer greedily (float32) with the very tokens vLLM 0.32 on CPU answers with it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGETS = ("q_proj", "v_proj")
ALPHA_PER_RANK = 2  # lora_alpha = 2 r: scaling 2, as common fine-tunes ship


def shapes(model_config: dict[str, int]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target projection."""
    hidden = model_config["hidden_size"]
    head = model_config.get("head_dim") or hidden // model_config["num_attention_heads"]
    kv_heads = model_config.get("num_key_value_heads") or model_config["num_attention_heads"]
    return {"q_proj": (hidden, model_config["num_attention_heads"] * head), "v_proj": (hidden, kv_heads * head)}


def build(model: Path, out: Path, rank: int, seed: int) -> None:
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((model / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model), "r": rank,
        "lora_alpha": ALPHA_PER_RANK * rank, "lora_dropout": 0.0, "target_modules": list(TARGETS), "bias": "none",
        "fan_in_fan_out": False, "modules_to_save": None, "init_lora_weights": True, "use_rslora": False,
        "use_dora": False, "rank_pattern": {}, "alpha_pattern": {}, "inference_mode": True,
    }, indent=2, sort_keys=True))
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name, (fan_in, fan_out) in shapes(cfg).items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{name}"
            # 0.1 against the base weights' 0.02 (initializer_range): the update dominates, answers change
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(rank, fan_in, generator=gen) * 0.1).to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(fan_out, rank, generator=gen) * 0.1).to(torch.bfloat16)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("out_root", type=Path)
    p.add_argument("adapters", nargs="+", help="NAME:RANK:SEED, one adapter folder each")
    a = p.parse_args()
    for spec in a.adapters:
        name, rank, seed = spec.split(":")
        build(a.model, a.out_root / name, int(rank), int(seed))
