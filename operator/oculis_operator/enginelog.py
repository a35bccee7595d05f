"""What a vLLM start-up log says about its KV cache, and how far a capacity plan is from it. Pure.

Reads the lines vLLM V1 prints at start-up (vllm-engine note section 3): the version banner, the
non-default args, `Model loading took X GiB`, `Available KV cache memory: X GiB` (per GPU) and
`GPU KV cache size: N tokens`; V0's `# GPU blocks: N` (16-token blocks) too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

GiB = 1024**3
# The acceptance bound of issue 11: within max(0.5 GiB, 2 %) of the logged KV memory per GPU.
TOLERANCE_GIB, TOLERANCE_SHARE = 0.5, 0.02

_VERSION = [re.compile(p) for p in (r"\bversion (\d+)\.(\d+)\.\d+", r"LLM engine \(v(\d+)\.(\d+)",
                                    r"API server version (\d+)\.(\d+)")]
_ARGS = re.compile(r"non-default args: (\{.*\})")
_CONFIG_KV = re.compile(r"\b(tensor_parallel_size|max_seq_len|quantization|kv_cache_dtype|enforce_eager)=([^,\s]+)")


@dataclass(frozen=True)
class StartupLog:
    version: tuple[int, int] | None = None
    model: str | None = None
    tensor_parallel: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    enforce_eager: bool = False
    total_gib: float | None = None
    weights_gib: float | None = None
    available_kv_gib: float | None = None
    kv_tokens: int | None = None
    num_gpu_blocks: int | None = None


def _float(pattern: str, text: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def parse(text: str) -> StartupLog:
    """The facts a start-up log states; a field it does not state stays None (or vLLM's default)."""
    fields: dict[str, Any] = {}
    for pattern in _VERSION:
        if m := pattern.search(text):
            fields["version"] = (int(m.group(1)), int(m.group(2)))
            break
    if m := _ARGS.search(text):
        try:
            args = ast.literal_eval(m.group(1))
        except (ValueError, SyntaxError):  # a value that is no literal (an enum repr): read the simple pairs
            args = {k: ast.literal_eval(v) for k, v in re.findall(r"'(\w+)': ('[^']*'|[\d.]+|True|False)",
                                                                   m.group(1))}
        if isinstance(args, dict):
            for key, name in (("model", "model"), ("tensor_parallel_size", "tensor_parallel"),
                              ("max_model_len", "max_model_len"), ("gpu_memory_utilization", "gpu_memory_utilization"),
                              ("max_num_seqs", "max_num_seqs"), ("max_num_batched_tokens", "max_num_batched_tokens"),
                              ("kv_cache_dtype", "kv_cache_dtype"), ("quantization", "quantization"),
                              ("enforce_eager", "enforce_eager")):
                if args.get(key) is not None:
                    fields[name] = args[key]
    if "model" not in fields and (m := re.search(r"with config: model='([^']+)'", text)):
        fields["model"] = m.group(1)
    for key, value in _CONFIG_KV.findall(text):  # the engine's resolved config line fills what args left out
        value = value.strip("'\"")
        if key == "tensor_parallel_size" and "tensor_parallel" not in fields:
            fields["tensor_parallel"] = int(value)
        elif key == "max_seq_len" and "max_model_len" not in fields and value.isdigit():
            fields["max_model_len"] = int(value)
        elif key == "quantization" and value != "None" and "quantization" not in fields:
            fields["quantization"] = value
        elif key == "kv_cache_dtype" and "kv_cache_dtype" not in fields:
            fields["kv_cache_dtype"] = value
        elif key == "enforce_eager" and "enforce_eager" not in fields:
            fields["enforce_eager"] = value == "True"
    if m := re.search(r"max_num_batched_tokens=(\d+)", text):
        fields.setdefault("max_num_batched_tokens", int(m.group(1)))
    total = _float(r"total_memory=([\d.]+)GiB", text)
    if total is None and (m := re.search(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\)", text)):
        total = float(m.group(2))
    fields["total_gib"] = total
    fields["weights_gib"] = _float(r"(?:Model loading took|Loading model weights took) ([\d.]+) G", text)
    fields["available_kv_gib"] = _float(r"Available KV cache memory: ([\d.]+) GiB", text)
    if m := re.search(r"GPU KV cache size: ([\d,]+) tokens", text):
        fields["kv_tokens"] = int(m.group(1).replace(",", ""))
    if m := re.search(r"num_gpu_blocks is: (\d+)|# GPU blocks: (\d+)", text):
        fields["num_gpu_blocks"] = int(m.group(1) or m.group(2))
        if m.group(2) and "kv_tokens" not in fields:
            fields["kv_tokens"] = 16 * int(m.group(2))  # V0: 16-token blocks
    return StartupLog(**fields)


@dataclass(frozen=True)
class Comparison:
    planned_tokens: int
    logged_tokens: int | None
    planned_kv_gib: float
    logged_kv_gib: float | None
    error_gib: float | None  # planned - logged KV memory per GPU: > 0 over-promises
    error_percent: float | None
    within_tolerance: bool | None


def compare(planned_tokens: int, planned_kv_bytes: int, log: StartupLog) -> Comparison:
    planned_gib = planned_kv_bytes / GiB
    logged = log.available_kv_gib
    error = None if logged is None else planned_gib - logged
    share = None if error is None or not logged else 100 * error / logged
    within = None if error is None or logged is None else abs(error) <= max(TOLERANCE_GIB, TOLERANCE_SHARE * logged)
    return Comparison(planned_tokens, log.kv_tokens, round(planned_gib, 3), logged,
                      None if error is None else round(error, 3), None if share is None else round(share, 2), within)
