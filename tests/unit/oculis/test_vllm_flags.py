"""Flags a vLLM version no longer has are refused by the schema, naming the field, the flag and the version
the engine image runs (the real parser's side: tests/realengine/test_engine_args.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from oculis.upstream import GPUUpstreamSpec
from oculis.vllm_flags import VLLM_IMAGE, flag_name, removed_flag_problem, vllm_version


def spec(image: str | None = None, **engine: object) -> GPUUpstreamSpec:
    body: dict[str, object] = {"provider": "vllm", "model": "Qwen/Qwen3-8B", "gpu": {"product": "H100-80GB"},
                               "engine": engine}
    if image:
        body["image"] = image
    return GPUUpstreamSpec.model_validate(body)


@pytest.mark.parametrize(("image", "arg", "refused"), [
    ("vllm/vllm-openai:v0.32.0", "--swap-space=4", True),
    ("vllm/vllm-openai:v0.17.1", "--swap-space=4", False),  # still parsed (and ignored) before 0.18
    ("vllm/vllm-openai:v0.11.0", "--disable-log-requests", False),
    ("vllm/vllm-openai:v0.12.0", "--disable-log-requests", True),
    (None, "--disable_log_requests", True),  # the pinned image; '_' spelling as vLLM's parser takes it
    ("vllm/vllm-openai:v0.11.0", "--num-scheduler-steps=8", True),
    ("vllm/vllm-openai:latest", "--use-v2-block-manager", True),  # judged as the pinned version
    ("vllm/vllm-openai:v0.32.0", "--enforce-eager", False),
])
def test_removed_flags_by_version(image: str | None, arg: str, refused: bool) -> None:
    problem = removed_flag_problem([arg], image)
    assert (problem is not None) == refused
    if refused:
        v = vllm_version(image or VLLM_IMAGE) or (0, 20)
        assert problem and problem.startswith(f"engine.extraArgs[0]: {flag_name(arg)} does not exist in vLLM "
                                              f"{v[0]}.{v[1]}")
        with pytest.raises(ValidationError, match=r"engine.extraArgs\[0\]"):
            spec(image, extraArgs=[arg])


def test_preemption_mode_recompute_loads_on_every_version_and_swap_names_the_version() -> None:
    for image in (None, "vllm/vllm-openai:v0.32.0"):
        assert spec(image, preemptionMode="recompute").engine is not None
    with pytest.raises(ValidationError, match=r"preemptionMode: swap .* runs vLLM 0\.32"):
        spec("vllm/vllm-openai:v0.32.0", preemptionMode="swap")
