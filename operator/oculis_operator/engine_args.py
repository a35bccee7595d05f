"""Engine settings -> `vllm serve` arguments, through one field -> flag table.

Spelled as `vllm serve` spells them in the pinned engine (VLLM_IMAGE). Never emitted:
`--preemption-mode` and `--swap-space` (V1 only recomputes; the schema refuses `swap`, and refuses
extraArgs the image's vLLM no longer has: oculis.vllm_flags).
`extraArgs` go last; one that repeats a flag Oculis sets from a typed field is refused, naming it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from oculis.adapters import LORA_FLAGS, lora_args
from oculis.engine import Engine
from oculis.router_upstream import KV_EVENTS_PORT
from oculis.upstream import GPUUpstreamSpec
from oculis.vllm_flags import VLLM_IMAGE as VLLM_IMAGE  # the pinned engine, rendered when spec.image is unset
from oculis.vllm_flags import flag_name

PORT = 8000

# (field, flag, how to render the value; None = omit)
FLAGS: list[tuple[str, str, Callable[[Any], str | None]]] = [
    ("max_model_len", "--max-model-len", lambda v: None if v is None else str(v)),
    ("max_num_seqs", "--max-num-seqs", lambda v: None if v is None else str(v)),
    ("max_num_batched_tokens", "--max-num-batched-tokens", lambda v: None if v is None else str(v)),
    ("scheduler_policy", "--scheduling-policy", str),
    ("gpu_memory_utilization", "--gpu-memory-utilization", lambda v: f"{v:g}"),
    ("kv_cache_dtype", "--kv-cache-dtype", str),
    ("quantization", "--quantization", lambda v: None if v is None else str(v)),
]
BOOLEAN_FLAGS = {"prefix_caching": "enable-prefix-caching"}
OWNED = {f for _, f, _ in FLAGS} | {f"--{b}" for b in BOOLEAN_FLAGS.values()} | {
    f"--no-{b}" for b in BOOLEAN_FLAGS.values()} | {"--tensor-parallel-size", "--speculative-config", "--host",
                                                     "--port", "--served-model-name", "--model", "--kv-events-config",
                                                     *LORA_FLAGS}
# The engine's KV-cache events, published for the router's kv-events picker (oculis_router.kvsub).
KV_EVENTS_CONFIG = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                               "endpoint": f"tcp://*:{KV_EVENTS_PORT}", "topic": "kv-events"},
                              sort_keys=True, separators=(",", ":"))


def publishes_kv_events(spec: GPUUpstreamSpec) -> bool:
    return spec.routing is not None and spec.routing.picker == "kv-events"


class ExtraArgError(ValueError):
    pass


def speculative_config(engine: Engine) -> str | None:
    spec = engine.speculative
    if spec is None or not spec.enabled:
        return None
    cfg: dict[str, Any] = {"num_speculative_tokens": spec.num_speculative_tokens}
    if spec.draft_model:
        cfg["model"] = spec.draft_model  # a draft model, or an EAGLE head with its method
    if spec.method or not spec.draft_model:
        cfg["method"] = spec.method or "ngram"
        if cfg["method"] == "ngram":
            cfg["prompt_lookup_max"] = spec.num_speculative_tokens
    return json.dumps(cfg, sort_keys=True, separators=(",", ":"))


def build(spec: GPUUpstreamSpec, resolved: dict[str, int], alias: str | None = None) -> list[str]:
    """argv after `vllm serve`: the model, then flags in table order, then extraArgs.

    `resolved` carries the values the capacity check planned for (profile defaults included), so
    the engine runs exactly what was checked. `alias` (the upstream's name) is served besides the
    model id and is the name the router asks for: it stays the same when `spec.model` changes, so
    old and new pods both answer it during the rollout (vLLM answers 404 to a name it does not
    serve). `--served-model-name` takes several names, so they are separate arguments."""
    engine = spec.engine or Engine()
    tp = spec.gpu.count if spec.gpu else 1
    names = [alias, spec.model] if alias and alias != spec.model else [spec.model]
    argv = [spec.model, "--host=0.0.0.0", f"--port={PORT}", "--served-model-name", *names,
            f"--tensor-parallel-size={tp}"]
    for field, flag, render in FLAGS:
        value = resolved.get(field, getattr(engine, field))
        text = render(value)
        if text is not None:
            argv.append(f"{flag}={text}")
    for field, name in BOOLEAN_FLAGS.items():
        argv.append(f"--{name}" if getattr(engine, field) else f"--no-{name}")
    sc = speculative_config(engine)
    if sc:
        argv.append(f"--speculative-config={sc}")
    if publishes_kv_events(spec):
        argv.append(f"--kv-events-config={KV_EVENTS_CONFIG}")
    if spec.lora_enabled:
        argv += lora_args(spec.adapters or [], engine.max_loras, engine.max_lora_rank, spec.runtime_adapters)
    for i, extra in enumerate(engine.extra_args):
        flag = flag_name(extra)
        if flag in OWNED or flag in ("--preemption-mode", "--swap-space"):
            raise ExtraArgError(f"spec.engine.extraArgs[{i}]: {flag} is set by Oculis from a typed field "
                                "(or unsupported by vLLM V1); use the engine field instead")
    return argv + list(engine.extra_args)
