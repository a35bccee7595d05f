"""`oculis sim` command line: bad input is one line and exit 2 (vLLM's words where it has them), the
JSON keys are the documented ones, the KV blocks are the operator's plan, and a pod's rendered
`vllm serve` arguments parse unchanged."""

import json
from pathlib import Path

import pytest

from oculis.engine import Engine
from oculis.gpus import lookup
from oculis.upstream import GPUUpstreamSpec
from oculis_cli.main import main
from oculis_operator import capacity, catalog, engine_args
from oculis_sim import cli

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    p = tmp_path / "chat.yaml"
    p.write_text("prompt_tokens: {mean: 500, stdev: 100, min: 16, max: 1000}\noutput_tokens: 64\n"
                 "stages: [{rate: 5, seconds: 10}]\nseed: 3\n")
    return p


def bad(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["sim", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_unknown_model_without_model_config_names_the_flag_and_the_fix(capsys, workload) -> None:  # type: ignore[no-untyped-def]
    err = bad(capsys, "replay", "--model", "acme/Nope-7B", "--gpu", "H100-80GB", "--workload", str(workload))
    assert "--model 'acme/Nope-7B'" in err and "--model-config FILE" in err


def test_model_config_file_makes_an_unknown_model_simulable(capsys, workload, tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "m.yaml"
    cfg.write_text("paramsBillions: 8.03\nnumLayers: 32\nhiddenSize: 4096\nnumAttentionHeads: 32\nnumKvHeads: 8\n"
                   "headDim: 128\nvocabSize: 128256\nmaxPositionEmbeddings: 8192\n")
    assert main(["sim", "replay", "--model", "acme/Mine-8B", "--model-config", str(cfg), "--gpu", "H100-80GB",
                 "--workload", str(workload), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] > 0


def test_gpu_without_facts_is_refused_naming_the_choices(capsys, workload) -> None:  # type: ignore[no-untyped-def]
    err = bad(capsys, "replay", "--model", MODEL, "--gpu", "V100", "--workload", str(workload))
    assert "--gpu 'V100'" in err and "H100-80GB" in err and "L4-24GB" in err


def test_batched_tokens_below_max_num_seqs_is_refused_in_vllms_words(capsys, workload) -> None:  # type: ignore[no-untyped-def]
    err = bad(capsys, "replay", "--model", MODEL, "--gpu", "H100-80GB", "--max-num-seqs", "256",
              "--max-num-batched-tokens", "128", "--workload", str(workload))
    assert "max_num_batched_tokens (128) must be greater than or equal to max_num_seqs (256)" in err
    assert err.startswith("oculis sim replay: error: --max-num-batched-tokens 128:")


def test_max_model_len_above_the_kv_cache_is_refused_in_vllms_words(capsys, workload) -> None:  # type: ignore[no-untyped-def]
    err = bad(capsys, "replay", "--model", MODEL, "--gpu", "L4-24GB", "--max-model-len", "131072",
              "--workload", str(workload))
    assert "--max-model-len 131072" in err
    assert "To serve at least one request with the model's max seq len (131072)" in err
    assert "estimated maximum model length is" in err and "decreasing `max_model_len`" in err


def test_bad_workload_and_bad_speculative_config_are_one_line(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    wl = tmp_path / "w.yaml"
    wl.write_text("prompt_tokens: 10\noutput_tokens: 5\nstages: [{rate: fast, seconds: 3}]\n")
    err = bad(capsys, "replay", "--model", MODEL, "--gpu", "H100-80GB", "--workload", str(wl))
    assert "stages[0].rate" in err
    err = bad(capsys, "replay", "--model", MODEL, "--gpu", "H100-80GB", "--workload", str(wl),
              "--speculative-config", "{oops")
    assert "--speculative-config" in err


def test_json_output_has_exactly_the_documented_keys_and_says_simulated(capsys, workload) -> None:  # type: ignore[no-untyped-def]
    assert main(["sim", "replay", "--model", MODEL, "--gpu", "H100-80GB", "--workload", str(workload),
                 "-o", "json"]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert set(data) == {"ttft_ms", "itl_ms", "e2e_ms", "output_tokens_per_s", "requests_per_s", "preemptions",
                         "kv_blocks", "requests", "simulated", "note", "model", "gpu", "tp", "workload_requests",
                         "refused", "refused_why", "kv_cache_tokens", "peak_kv_usage", "prefix_cache_hit_rate",
                         "mean_acceptance_length"}  # every figure the text prints (QA2 #28)
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        assert set(data[key]) == {"mean", "p50", "p90", "p99"}
    assert "simulated" in out.err


def test_text_output_says_simulated(capsys, workload) -> None:  # type: ignore[no-untyped-def]
    assert main(["sim", "replay", "--model", MODEL, "--gpu", "H100-80GB", "--workload", str(workload)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("SIMULATED") and "TTFT" in out and "preemptions" in out and "peak KV usage" in out


def test_kv_blocks_are_the_operators_capacity_plan() -> None:
    s = cli.settings_from(cli.build_parser().parse_args(
        ["replay", "--model", MODEL, "--gpu", "A100-80GB", "--max-num-seqs", "64", "--max-model-len", "8192",
         "--workload", "x"]))
    plan = capacity.plan(catalog.lookup(MODEL), lookup("A100-80GB"), 1,
                         Engine(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=8192))
    assert s.num_blocks == plan.kv_cache_tokens // 16 and s.max_num_batched_tokens == 2048


def test_a_pods_rendered_vllm_arguments_start_serve_unchanged(capsys) -> None:  # type: ignore[no-untyped-def]
    spec = GPUUpstreamSpec.model_validate({
        "provider": "vllm", "model": MODEL, "replicas": 1, "gpu": {"product": "H100-80GB", "count": 1},
        "engine": {"maxNumSeqs": 64, "maxModelLen": 8192, "speculative": {"method": "ngram",
                                                                          "numSpeculativeTokens": 3},
                   "extraArgs": ["--enforce-eager"]}})
    argv = engine_args.build(spec, {"max_num_batched_tokens": 4096})
    args, ignored = cli.build_parser().parse_known_args(["serve", *argv, "--gpu", "NVIDIA-H100-80GB-HBM3",
                                                         "--host", "127.0.0.1", "--port", "18000"])
    s = cli.settings_from(args)
    assert (s.max_num_seqs, s.max_num_batched_tokens, s.max_model_len) == (64, 4096, 8192)
    assert s.spec is not None and s.spec.method == "ngram" and s.spec.num_speculative_tokens == 3
    assert s.served_names == (MODEL,) and (args.host, args.port) == ("127.0.0.1", 18000)  # later flags win
    assert "--enforce-eager" in ignored


def test_gpu_comes_from_the_environment_when_not_given(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OCULIS_SIM_GPU", "NVIDIA-L40S")
    s = cli.settings_from(cli.build_parser().parse_args(["serve", MODEL, "--max-model-len", "8192"]))
    assert s.gpu.key == "L40S-48GB" and (s.max_num_seqs, s.max_num_batched_tokens) == (256, 2048)


def test_oculis_cli_without_the_simulator_says_how_to_install_it() -> None:
    import subprocess
    import sys

    code = ("import sys; sys.modules['oculis_sim'] = None\n"
            "from oculis_cli.main import main\n"
            "sys.exit(main(['sim', 'replay', '--workload', 'w.yaml']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "pip install -e '.[sim]'" in proc.stderr and "Traceback" not in proc.stderr


def test_sim_help_reaches_the_simulators_own_parser(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        main(["sim", "--help"])
    assert exc.value.code == 0 and "replay" in capsys.readouterr().out


def test_engine_spec_decode_counters_keep_vllms_invariants() -> None:
    from oculis_sim import config
    from oculis_sim.engine import EngineCore
    from oculis_sim.scheduler import Request
    from oculis_sim.specdecode import expected_tokens_per_step

    s = config.resolve(MODEL, "H100-80GB", max_model_len="4096", acceptance_rate=0.6,
                       speculative_config='{"method": "eagle", "num_speculative_tokens": 3, '
                                          '"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}')
    core = EngineCore(s)
    for i in range(8):
        core.add(Request(i, 50, 400))
    t = 0.0
    while core.has_work():
        t = core.step(t).end
    c = core.counters
    assert sum(c.spec_accepted_per_pos) == c.spec_accepted
    assert c.spec_accepted_per_pos == sorted(c.spec_accepted_per_pos, reverse=True)
    assert c.spec_draft_tokens <= 3 * c.spec_drafts and c.generation_tokens == 8 * 400
    assert abs((1 + c.spec_accepted / c.spec_drafts) - expected_tokens_per_step(0.6, 3)) < 0.1


def test_the_longest_allowed_sequence_fits_the_blocks_a_sequence_can_use(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from oculis_sim import config, replay, workload

    probe = config.resolve(MODEL, "L4-24GB", max_model_len="auto")
    # a request of exactly max_model_len tokens runs alone to completion (no spinning on a missing block)
    res = replay.run(probe, workload.parse({"requests": [{"prompt_tokens": probe.max_model_len - 2,
                                                          "output_tokens": 2}]}))
    assert res.summary["requests"] == 1 and res.refused == 0
    with pytest.raises(config.SimConfigError, match="estimated maximum model length is"):
        config.resolve(MODEL, "L4-24GB", max_model_len=str(probe.max_model_len + 16))


def test_num_gpu_blocks_override_sets_the_pool_and_a_small_pool_preempts(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    wl = tmp_path / "burst.yaml"
    wl.write_text("prompt_tokens: 200\noutput_tokens: 64\nstages: [{rate: inf, requests: 20}]\n")
    argv = ["sim", "replay", "--model", MODEL, "--gpu", "H100-80GB", "--max-model-len", "512", "--workload",
            str(wl), "-o", "json"]
    assert main([*argv, "--num-gpu-blocks-override", "60"]) == 0  # 59 usable blocks: ~3 sequences of 264
    small = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    big = json.loads(capsys.readouterr().out)
    assert small["kv_blocks"] == 60 and small["preemptions"] > 0 and big["preemptions"] == 0
    assert small["requests"] == big["requests"] == 20


def test_replay_refuses_requests_longer_than_max_model_len_as_vllm_would(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    wl = tmp_path / "long.yaml"
    wl.write_text("requests: [{prompt_tokens: 900, output_tokens: 200}, {prompt_tokens: 100, output_tokens: 20}]\n")
    assert main(["sim", "replay", "--model", MODEL, "--gpu", "H100-80GB", "--max-model-len", "1024",
                 "--workload", str(wl)]) == 0
    out = capsys.readouterr().out
    assert "requests 1 (1 refused: longer than max_model_len)" in out


def test_one_line_errors_eagle_without_its_head_is_refused_as_vllm_refuses_it(capsys) -> None:  # type: ignore[no-untyped-def]
    """vLLM refuses an EAGLE method without its head checkpoint; the simulator said so with a pydantic
    traceback (the schema refuses it since the real-engine tier)."""
    code = cli.main(["replay", "--model", MODEL, "--gpu", "H100-80GB", "--workload", "nofile.yaml",
                     "--speculative-config", '{"method": "eagle", "num_speculative_tokens": 3}'])
    err = capsys.readouterr().err
    assert code == 2 and "without speculative model" in err and "Traceback" not in err and err.count("\n") == 1
