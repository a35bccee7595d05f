"""`oculis sim serve --vllm-version 0.10` answered /version 0.32.0 (its API is 0.32's) and its start line
said nothing of the release whose timing it models, so a run could not tell which it was (QA pass 3):
the start line names it, and a fitted --step-profile."""

from oculis_sim import config, steptime
from oculis_sim.engine_log import startup_lines


def test_the_start_line_names_the_timed_release_and_a_fitted_profile() -> None:
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", vllm_version="0.10")
    assert "timed as vLLM 0.10 (v1 (0.8-0.11))" in startup_lines(s)[0]
    fitted = steptime.FittedSteps(step_s=0.003, request_s=0.0, prefill_token_s=2e-5, decode_token_s=0.0)
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", step_profile=fitted)
    assert startup_lines(s)[0].endswith(", fitted --step-profile")


def test_a_release_newer_than_any_checked_says_its_timings_are_extrapolated() -> None:
    # QA pass 3, Q21: --vllm-version 0.99 was timed as the newest era without a word.
    s = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", vllm_version="0.99")
    assert ("timed as vLLM 0.99 (v1 async scheduling (>= 0.12); newer than any release checked (0.32): its "
            "timings are that era's, extrapolated)") in startup_lines(s)[0]
    checked = config.resolve("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB", vllm_version="0.32")
    assert "extrapolated" not in startup_lines(checked)[0]
