"""vLLM 0.32's LoRA flags read as its own parser and config read them, so a value vLLM refuses at start
is refused here too, in one line (exit 2), never a traceback or a silent start with other settings.

- `--lora-modules`: `name=path` when the item has '=' and no ',', else JSON `{"name", "path",
  "base_model_name", "is_3d_lora_weight"}` (vllm/entrypoints/launchers/cli_args.py, LoRAParserAction;
  vllm/entrypoints/openai/models/protocol.py, LoRAModulePath).
- `--max-loras` at least 1 and `--max-lora-rank` one of vLLM's ranks (vllm/config/lora.py, LoRAConfig,
  MaxLoRARanks).
- `--lora-modules` without `--enable-lora`: vLLM's start loads the static adapters and its worker
  refuses them ("LoRA is not enabled", vllm/v1/worker/lora_model_runner_mixin.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from oculis.adapters import VLLM_LORA_RANKS  # vllm/config/lora.py MaxLoRARanks, the CRD's maxLoraRank too
from oculis_sim.config import SimConfigError

_FIELDS = {"name", "path", "base_model_name", "is_3d_lora_weight"}
_FORMS = 'give name=/path/to/adapter or {"name": "sql", "path": "/path/to/adapter"}'


def lora_modules(items: Sequence[str]) -> dict[str, str]:
    """Adapter name -> path of each `--lora-modules` item, as vLLM parses them."""
    modules: dict[str, str] = {}
    for item in items:
        if not item:
            continue  # vLLM skips empty items
        if "=" in item and "," not in item:
            name, path = item.split("=", 1)
            modules[name] = path
            continue
        try:
            d = json.loads(item)
        except json.JSONDecodeError:
            raise SimConfigError(f"--lora-modules {item!r}: Invalid JSON format for --lora-modules (vLLM's "
                                 f"words); {_FORMS}") from None
        if (not isinstance(d, dict) or not {"name", "path"} <= d.keys() or not d.keys() <= _FIELDS
                or not all(isinstance(d[k], str) for k in ("name", "path"))):
            raise SimConfigError(f"--lora-modules {item!r}: Invalid fields for --lora-modules (vLLM's words): "
                                 f"name and path (strings) are required, base_model_name and is_3d_lora_weight "
                                 f"optional; {_FORMS}")
        modules[d["name"]] = d["path"]
    return modules


def check(enable_lora: bool, modules: Sequence[str], max_loras: int, max_lora_rank: int) -> None:
    """Refuse the LoRA settings vLLM 0.32 refuses at start."""
    if modules and not enable_lora:
        raise SimConfigError("--lora-modules: LoRA is not enabled (vLLM's start fails loading them); add "
                             "--enable-lora or drop --lora-modules")
    if not enable_lora:
        return  # vLLM builds no LoRA config, so it reads neither number
    if max_loras < 1:
        raise SimConfigError(f"--max-loras {max_loras}: must be at least 1 (vLLM's LoRAConfig; default 1)")
    if max_lora_rank not in VLLM_LORA_RANKS:
        raise SimConfigError(f"--max-lora-rank {max_lora_rank}: not a rank vLLM accepts; use one of "
                             f"{', '.join(map(str, VLLM_LORA_RANKS))} (default 16)")
