"""`oculis capacity plan --hf-config / --sweep` and `oculis capacity check --log`, as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).parents[2] / "fixtures" / "hf-configs"

# kv-observed.md worked case C01: a public vLLM 0.19.0 start-up log (Llama-3.1-8B-Instruct, 1x H100).
C01_LOG = """\
INFO 04-22 00:03:30 [utils.py:299]   version 0.19.0
INFO 04-22 00:03:35 [entrypoints/utils.py:233] non-default args: {'model_tag': 'meta-llama/Llama-3.1-8B-Instruct', \
'model': 'meta-llama/Llama-3.1-8B-Instruct', 'max_model_len': 8192, 'gpu_memory_utilization': 0.95, \
'enable_prefix_caching': False}
DEBUG 04-22 00:03:47 [v1/worker/gpu_worker.py:284] worker init memory snapshot: torch_peak=0.0GiB, \
free_memory=78.68GiB, total_memory=79.19GiB, cuda_memory=0.51GiB, torch_memory=0.0GiB, non_torch_memory=0.51GiB
INFO 04-22 00:04:02 [v1/worker/gpu_model_runner.py:4820] Model loading took 14.99 GiB memory and 14.429680 seconds
INFO 04-22 00:04:20 [v1/worker/gpu_worker.py:436] Available KV cache memory: 58.11 GiB
INFO 04-22 00:04:20 [v1/core/kv_cache_utils.py:1319] GPU KV cache size: 476,016 tokens
"""


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oculis_cli.main", "capacity", *args], capture_output=True, text=True)


def test_a_hugging_face_config_json_plans_as_it_is_downloaded() -> None:
    proc = cli("plan", "--hf-config", str(FIXTURES / "Llama-3.3-70B-Instruct-FP8-dynamic.json"), "--gpu", "H100-80GB",
               "--tensor-parallel", "2", "--vllm-version", "0.19", "-o", "json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["vllm_version"] == "0.19"
    # quantization_config (fp8 linear layers, 16-bit embeddings/lm_head) read from the file itself
    assert 33.7 * 2**30 < out["weights_bytes_per_gpu"] < 34.0 * 2**30
    assert out["non_torch_bytes"] > 2 * 2**30  # TP 2 on 0.19
    refused = cli("plan", "--hf-config", str(FIXTURES / "Qwen3-Next-80B-A3B-Instruct.json"), "--gpu", "H100-80GB")
    assert refused.returncode == 2 and "does not model it" in refused.stderr and "Traceback" not in refused.stderr


def test_bad_config_json_and_sweep_name_the_flag(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    proc = cli("plan", "--hf-config", str(broken), "--gpu", "H100-80GB")
    assert proc.returncode == 2 and "--hf-config" in proc.stderr and "not valid JSON" in proc.stderr
    both = cli("plan", "--hf-config", str(broken), "--model-config", str(broken), "--gpu", "H100-80GB")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    for sweep, text in (("seqs=1", "FLAG one of"), ("max-num-seqs=a,b", "must be an integer")):
        proc = cli("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--sweep", sweep)
        assert proc.returncode == 2 and text in proc.stderr
    proc = cli("plan", "--model", "Qwen/Qwen3-8B", "--gpu", "H100-80GB", "--vllm-version", "latest")
    assert proc.returncode == 2 and "--vllm-version 'latest'" in proc.stderr


def test_sweep_reports_tokens_safe_sequences_and_storms_per_value() -> None:
    proc = cli("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S-48GB", "--max-model-len", "16384",
               "--profile", "rag", "--sweep", "max-num-seqs=8,32,64,128,256", "-o", "json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["sweep"] == "max-num-seqs"
    rows = {r["max-num-seqs"]: r for r in out["rows"]}
    assert list(rows) == [8, 32, 64, 128, 256]
    safe = rows[8]["safe_max_num_seqs"]
    for n, r in rows.items():
        assert r["preemption_storm"] == (n > r["safe_max_num_seqs"]) and r["fits"] == (n <= r["safe_max_num_seqs"])
    assert rows[8]["fits"] and rows[256]["preemption_storm"] and 8 < safe < 256
    assert rows[256]["kv_cache_tokens"] <= rows[8]["kv_cache_tokens"]  # more sequences, larger profile peak
    text = cli("plan", "--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "L40S-48GB", "--max-model-len",
               "16384", "--profile", "rag", "--sweep", "max-num-seqs=8,256")
    assert "preemption storm" in text.stdout and "safe max-num-seqs" in text.stdout


def test_check_compares_the_plan_with_a_real_startup_log(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(C01_LOG)
    proc = cli("check", "--log", str(log), "-o", "json")
    out = json.loads(proc.stdout)
    # everything from the log: model, GPU (torch total 79.19 GiB), version 0.19, gmu 0.95, vLLM's H100 defaults
    assert proc.returncode == 0 and out["gpu"] == "H100-80GB" and out["vllm_version"] == "0.19"
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (1024, 8192)
    assert out["logged_tokens"] == 476_016 and abs(out["error_gib"]) < 0.05 and out["within_tolerance"]
    # the same log against a plan that over-promises (0.5 more of the GPU) is outside the bound: exit 3
    drift = cli("check", "--log", str(log), "--gpu-memory-utilization", "0.99")
    assert drift.returncode == 3 and "OUTSIDE" in drift.stdout
    empty = tmp_path / "empty.log"
    empty.write_text("INFO nothing here\n")
    proc = cli("check", "--log", str(empty))
    assert proc.returncode == 2 and "Available KV cache memory" in proc.stderr
