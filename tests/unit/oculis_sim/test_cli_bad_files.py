"""`oculis sim` bad files and hosts: each is one line naming the flag and the fix, exit 2, never a
traceback (the CLI's own strict reader and the router's bind preflight, not copies)."""

from collections.abc import Callable
from pathlib import Path

import pytest

from oculis_cli.main import main

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
GOOD_WORKLOAD = "prompt_tokens: 100\noutput_tokens: 8\nstages: [{rate: 5, requests: 3}]\n"
GOOD_MODEL = ("paramsBillions: 8.03\nnumLayers: 32\nhiddenSize: 4096\nnumAttentionHeads: 32\nnumKvHeads: 8\n"
              "headDim: 128\nvocabSize: 128256\nmaxPositionEmbeddings: 8192\n")
NOT_UTF8 = b"prompt_tokens: 100\n# caf\xe9\n"
DEEP = "[" * 20000 + "]" * 20000


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


CASES: list[tuple[str, Callable[[Path], list[str]], list[str]]] = [
    ("workload not UTF-8", lambda t: ["--workload", str(write(t, "w.yaml", NOT_UTF8))],
     ["--workload", "not UTF-8", "save it as UTF-8"]),
    ("workload nested too deeply", lambda t: ["--workload", str(write(t, "w.yaml", DEEP))],
     ["--workload", "nested too deeply"]),
    ("workload JSON nested too deeply", lambda t: ["--workload", str(write(t, "w.json", DEEP))],
     ["--workload", "nested too deeply"]),
    ("workload is a directory", lambda t: ["--workload", str(t)], ["cannot read --workload"]),
    ("model config not UTF-8", lambda t: ["--workload", str(write(t, "w.yaml", GOOD_WORKLOAD)), "--model-config",
                                          str(write(t, "m.yaml", GOOD_MODEL.encode() + b"# \xff\n"))],
     ["--model-config", "not UTF-8"]),
    ("model config nested too deeply", lambda t: ["--workload", str(write(t, "w.yaml", GOOD_WORKLOAD)),
                                                  "--model-config", str(write(t, "m.yaml", DEEP))],
     ["--model-config", "nested too deeply"]),
]


@pytest.mark.parametrize(("case", "argv", "words"), CASES, ids=[c[0] for c in CASES])
def test_unreadable_sim_input_files_are_one_line_naming_the_flag(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, case: str, argv: Callable[[Path], list[str]],
        words: list[str]) -> None:
    assert main(["sim", "replay", "--model", MODEL, "--gpu", "H100-80GB", *argv(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis sim replay: error: ") and err.count("\n") == 1, err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("host", ["999.1.1.1", "no-such-host.invalid", "203.0.113.7"])
def test_sim_serve_host_that_is_not_this_machine_is_one_line_before_serving(
        capsys: pytest.CaptureFixture[str], host: str) -> None:
    # 203.0.113.7 (TEST-NET-3) resolves but is no address of this machine: the bind fails, nothing is sent.
    assert main(["sim", "serve", "--model", MODEL, "--gpu", "H100-80GB", "--host", host, "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis sim serve: error: ") and err.count("\n") == 1, err
    assert repr(host) in err and "127.0.0.1" in err, err


def test_sim_serve_port_outside_the_tcp_range_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["sim", "serve", "--model", MODEL, "--gpu", "H100-80GB", "--port", "70000"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'70000' is not a port" in err and "Traceback" not in err, err
