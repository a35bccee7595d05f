"""Which vLLM an engine image runs, and the `vllm serve` flags each vLLM version no longer has.

The one place for these facts: the schema refuses such a flag in `engine.extraArgs` (pydantic, so the
admission webhook, the Python API and `oculis capacity plan` refuse it at apply time) instead of letting
the pod crash-loop on `vllm serve: error: unrecognized arguments`; the capacity plan reads the version from
here too. Checked against the real parser of vLLM 0.32 (tests/realengine/test_engine_args.py); the
release that dropped each flag is cited.
"""

from __future__ import annotations

import re

# The engine image the operator runs when spec.image is unset, and the version it stands for.
VLLM_IMAGE = "vllm/vllm-openai:v0.20.0"
PINNED_VLLM = (0, 20)

# flag -> (first vLLM version without it, what to do instead). Versions before 0.11 ran the V0 engine,
# which Oculis does not plan for.
REMOVED_FLAGS: dict[str, tuple[tuple[int, int], str]] = {
    # V1 (the only engine from 0.11, #25033) always preempts by recompute; 0.32 refuses the flag.
    "--preemption-mode": ((0, 11), "vLLM V1 always preempts by recompute; use engine.preemptionMode "
                                   "(recompute is accepted and not rendered)"),
    # V0 multi-step scheduling and the v2 block manager went with the V0 engine.
    "--num-scheduler-steps": ((0, 11), "multi-step scheduling went with the V0 engine; remove it"),
    "--use-v2-block-manager": ((0, 11), "the V1 block manager is the only one; remove it"),
    # Deprecated by #21739 for --enable-log-requests (off by default), removed by #29402 (0.12).
    "--disable-log-requests": ((0, 12), "request logging is off by default; remove it (or "
                                        "--no-enable-log-requests)"),
    # Unused by V1 and removed from EngineArgs in 0.18 (#36216).
    "--swap-space": ((0, 18), "V1 never swaps KV blocks to CPU; remove it"),
}


def vllm_version(image: str | None) -> tuple[int, int] | None:
    """(major, minor) from an engine image tag such as vllm/vllm-openai:v0.19.1; None when the tag names
    no version (latest, nightly, a digest only)."""
    if not image:
        return None
    name = image.split("@", 1)[0]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else ""
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.\d+)?", tag)
    return (int(m.group(1)), int(m.group(2))) if m else None


def flag_name(arg: str) -> str:
    """`--swap_space=4` -> `--swap-space`: vLLM's parser takes '_' for '-' in flag names."""
    head = arg.split("=", 1)[0]
    return "--" + head[2:].replace("_", "-") if head.startswith("--") else head


def removed_flag_problem(args: list[str], image: str | None) -> str | None:
    """Why one of `args` (engine.extraArgs) would be refused by the image's vLLM, or None. An image tag
    with no version (latest) is judged as the pinned version, as the capacity plan is."""
    version = vllm_version(image or VLLM_IMAGE) or PINNED_VLLM
    for i, arg in enumerate(args):
        fact = REMOVED_FLAGS.get(flag_name(arg))
        if fact and version >= fact[0]:
            since, fix = fact
            return (f"engine.extraArgs[{i}]: {flag_name(arg)} does not exist in vLLM {version[0]}.{version[1]} "
                    f"(the engine image {image or VLLM_IMAGE}; gone since {since[0]}.{since[1]}), so the engine "
                    f"would refuse to start: {fix}")
    return None
