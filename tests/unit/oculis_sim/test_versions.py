"""The `--vllm-version` switch: the engine image's version picks the era whose overheads are simulated;
the default is the operator's pinned engine; an older V0 release is slower than V1 on the same work."""

import json
from pathlib import Path

import pytest

from oculis_cli.main import main
from oculis_operator import capacity, engine_args
from oculis_sim import config, replay, versions, workload

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(("text", "version"), [("0.15", (0, 15)), ("v0.15.1", (0, 15)), ("0.5.4", (0, 5)),
                                               ("vllm/vllm-openai:v0.20.0", (0, 20)), ("1.0", (1, 0))])
def test_versions_parse_as_the_image_tag_spells_them(text: str, version: tuple[int, int]) -> None:
    assert versions.parse(text) == version


@pytest.mark.parametrize("text", ["latest", "0", "0.3", "abc"])
def test_a_bad_version_is_refused(text: str) -> None:
    with pytest.raises(versions.VersionError, match="--vllm-version"):
        versions.parse(text)


def test_eras_follow_the_engine_history() -> None:
    assert versions.profile((0, 5)) is versions.V0  # V0, CPU work serial with the GPU
    assert versions.profile((0, 6)) is versions.V0_MULTISTEP
    assert versions.profile((0, 10)) is versions.V1_SYNC  # V1 default from 0.8
    assert versions.profile((0, 12)) is versions.V1_ASYNC  # async scheduling default (vllm#27614)
    assert versions.profile((0, 33)) is versions.V1_ASYNC
    assert not versions.V0.overlap and versions.V1_ASYNC.overlap


def test_the_default_is_the_pinned_engine_image() -> None:
    s = config.resolve(MODEL, "H100-80GB")
    assert s.vllm_version == capacity.DEFAULT_VLLM == capacity.vllm_version(engine_args.VLLM_IMAGE)
    assert config.resolve(MODEL, "H100-80GB", vllm_version=engine_args.VLLM_IMAGE).vllm_version == s.vllm_version


def test_v0_is_slower_than_v1_on_the_same_work() -> None:
    wl = workload.parse({"prompt_tokens": 500, "output_tokens": 128, "stages": [{"rate": 4, "seconds": 20}],
                         "seed": 1})
    old = replay.run(config.resolve(MODEL, "H100-80GB", vllm_version="0.5"), wl).summary
    new = replay.run(config.resolve(MODEL, "H100-80GB", vllm_version="0.15"), wl).summary
    assert new["itl_ms"]["mean"] < old["itl_ms"]["mean"]
    assert new["ttft_ms"]["mean"] < old["ttft_ms"]["mean"]  # V0's API server took ~15 ms a request


def test_cli_takes_the_version_and_refuses_a_bad_one(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    wl = tmp_path / "w.yaml"
    wl.write_text("prompt_tokens: 200\noutput_tokens: 16\nstages: [{rate: 2, seconds: 5}]\n")
    argv = ["sim", "replay", "--model", MODEL, "--gpu", "H100-80GB", "--workload", str(wl)]
    assert main([*argv, "--vllm-version", "0.5", "-o", "json"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert main([*argv, "--vllm-version", "vllm/vllm-openai:v0.15.1", "-o", "json"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert new["e2e_ms"]["mean"] < old["e2e_ms"]["mean"]
    assert main([*argv, "--vllm-version", "nightly"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--vllm-version 'nightly'" in err


def test_cpu_needs_a_fitted_step_profile_and_a_bad_one_is_one_line(capsys: pytest.CaptureFixture[str],
                                                                  tmp_path: Path) -> None:
    wl = tmp_path / "w.yaml"
    wl.write_text("prompt_tokens: 200\noutput_tokens: 16\nstages: [{rate: inf, requests: 3}]\nmax_concurrency: 1\n")
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("paramsBillions: 0.003\nnumLayers: 2\nhiddenSize: 256\nnumAttentionHeads: 4\nnumKvHeads: 2\n"
                   "headDim: 64\nvocabSize: 4096\nmaxPositionEmbeddings: 2048\n")
    argv = ["sim", "replay", "--model", "tiny", "--model-config", str(cfg), "--gpu", "CPU", "--block-size", "128",
            "--max-model-len", "512", "--num-gpu-blocks-override", "64", "--workload", str(wl)]
    assert main(argv) == 2
    assert "--step-profile" in capsys.readouterr().err
    prof = tmp_path / "p.yaml"
    prof.write_text("step_s: 0.01\nrequest_s: 0.001\nprefill_token_s: 5e-5\ndecode_token_s: 0\nwarp: 1\n")
    assert main([*argv, "--step-profile", str(prof)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warp: unknown key" in err
    prof.write_text("step_s: 0.01\nrequest_s: 0.001\nprefill_token_s: 5e-5\ndecode_token_s: 0\n")
    assert main([*argv, "--step-profile", str(prof), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["itl_ms"]["mean"] == pytest.approx(11.0)  # 10 ms a step + 1 ms for its one request
