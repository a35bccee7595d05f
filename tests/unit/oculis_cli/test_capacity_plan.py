import json
import subprocess
import sys
from pathlib import Path


def plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oculis_cli.main", "capacity", "plan", *args],
                          capture_output=True, text=True)


def test_json_plan_and_exit_codes() -> None:
    ok = plan("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "-o", "json")
    assert ok.returncode == 0
    out = json.loads(ok.stdout)
    assert {"weights_bytes_per_gpu", "kv_bytes_per_token", "kv_cache_tokens", "max_concurrency", "fits",
            "error_code", "message"} <= set(out)
    assert out["kv_bytes_per_token"] == 131072 and out["fits"] is True and out["error_code"] is None
    tp4 = json.loads(plan("--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "H100-80GB", "--tensor-parallel",
                          "4", "--max-model-len", "32768", "-o", "json").stdout)
    assert tp4["kv_bytes_per_token"] == 81920
    no = plan("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "A100-40GB", "--max-model-len", "900000")
    assert no.returncode == 3 and "ERR_OCULIS_KV_CACHE_EXHAUSTED" in no.stdout
    mm = plan("--model", "Qwen/Qwen2.5-7B-Instruct", "--gpu", "H100-80GB", "--draft-model",
              "meta-llama/Llama-3.2-1B-Instruct", "-o", "json")
    assert mm.returncode == 3 and json.loads(mm.stdout)["error_code"] == "ERR_OCULIS_TOKENIZER_MISMATCH"


def test_bad_arguments_exit_2_naming_the_flag() -> None:
    for args, text in ((["--gpu", "V100"], "--gpu: unknown GPU product 'V100'"),
                       (["--gpu", "H100-80GB", "--gpu-memory-utilization", "1.5"], "gpu-memory-utilization"),
                       (["--gpu", "H100-80GB", "--tensor-parallel", "0"], "--tensor-parallel: spec.gpu.count"),
                       (["--gpu", "H100-80GB", "--max-num-seqs", "x"], "invalid int value")):
        proc = plan("--model", "meta-llama/Llama-3.1-8B-Instruct", *args)
        assert proc.returncode == 2 and text in proc.stderr and "Traceback" not in proc.stderr


def test_a_model_outside_the_catalog_plans_from_a_model_config_file(tmp_path: Path) -> None:
    unknown = plan("--model", "acme/llama-ft", "--gpu", "H100-80GB")
    assert unknown.returncode == 2 and "--model-config FILE" in unknown.stderr
    cfg = tmp_path / "model.yaml"  # Llama-3.1-8B's facts under another name: the same plan
    cfg.write_text("paramsBillions: 8.03\nnumLayers: 32\nhiddenSize: 4096\nnumAttentionHeads: 32\nnumKvHeads: 8\n"
                   "headDim: 128\nvocabSize: 128256\nmaxPositionEmbeddings: 131072\n")
    out = json.loads(plan("--model", "acme/llama-ft", "--model-config", str(cfg), "--gpu", "H100-80GB",
                          "-o", "json").stdout)
    ref = json.loads(plan("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "-o", "json").stdout)
    assert out["kv_bytes_per_token"] == 131072 and out["kv_cache_tokens"] == ref["kv_cache_tokens"]
    cfg.write_text("numLayers: 0\n")
    bad = plan("--model", "x", "--model-config", str(cfg), "--gpu", "H100-80GB")
    assert bad.returncode == 2 and "modelConfig.numLayers" in bad.stderr and "Traceback" not in bad.stderr


def test_an_impossible_batch_is_advised_to_shrink_to_the_largest_safe_value() -> None:
    # The weights fit; only the activation peak of 10^8 sequences does not: more GPUs is the wrong fix.
    from oculis import gpus
    from oculis.engine import Engine
    from oculis_operator import capacity, catalog

    model, h100 = catalog.lookup("meta-llama/Llama-3.1-8B-Instruct"), gpus.lookup("H100-80GB")
    p = capacity.plan(model, h100, 1, Engine(max_num_seqs=100_000_000))
    assert not p.fits and p.error_code == capacity.KV_EXHAUSTED and "raise gpu.count" not in p.message
    safe = p.safe_max_num_seqs
    assert f"lower maxNumSeqs to at most {safe}" in p.message
    assert capacity.plan(model, h100, 1, Engine(max_num_seqs=safe)).fits  # largest: safe fits, safe + 1 does not
    assert not capacity.plan(model, h100, 1, Engine(max_num_seqs=safe + 1)).fits
    cli = plan("--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB", "--max-num-seqs", "100000000")
    assert cli.returncode == 3 and f"lower maxNumSeqs to at most {safe}" in cli.stdout
    # A huge explicit token budget per step is named as the culprit; weights that cannot fit keep the GPU advice.
    big_step = capacity.plan(model, h100, 1, Engine(max_num_seqs=4, max_num_batched_tokens=100_000_000))
    assert "lower maxNumBatchedTokens" in big_step.message
    weights = capacity.plan(catalog.lookup("meta-llama/Llama-3.1-70B-Instruct"), h100, 1)
    assert "raise gpu.count, quantize, or use a larger GPU" in weights.message
