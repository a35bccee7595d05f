"""`oculis sim serve`'s LoRA flags that vLLM 0.32 refuses at start (QA pass 3): malformed `--lora-modules`
items were tracebacks (KeyError, JSONDecodeError), and `--max-loras 0`, `--max-lora-rank 7` or
`--lora-modules` without `--enable-lora` started an engine vLLM would not. Each is now one line naming the
flag, the value and the fix, exit 2, before anything is served."""

from pathlib import Path

import pytest

from oculis_cli.main import main
from oculis_sim.config import SimConfigError
from oculis_sim.lora_flags import lora_modules

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def adapter(folder: Path) -> str:
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 8, "peft_type": "LORA"}')
    return str(folder)


@pytest.mark.parametrize(("flags", "words"), [
    (["--enable-lora", "--lora-modules", '{"name": "sql"}'], ["--lora-modules", "Invalid fields", "path"]),
    (["--enable-lora", "--lora-modules", "{bad"], ["--lora-modules '{bad'", "Invalid JSON format", "name=/path"]),
    (["--enable-lora", "--lora-modules", "sql"], ["--lora-modules 'sql'", "Invalid JSON format", "name=/path"]),
    (["--enable-lora", "--lora-modules", "[1, 2]"], ["--lora-modules '[1, 2]'", "Invalid fields"]),
    (["--enable-lora", "--lora-modules", '{"name": "sql", "path": "/a", "rank": 8}'], ["Invalid fields"]),
    (["--enable-lora", "--max-loras", "0"], ["--max-loras 0", "at least 1"]),
    (["--enable-lora", "--max-lora-rank", "7"], ["--max-lora-rank 7", "1, 8, 16, 32, 64, 128, 256, 320, 512"]),
    (["--lora-modules", "sql=/adapters/sql"], ["--lora-modules", "LoRA is not enabled", "--enable-lora"]),
], ids=["json without path", "bad json", "no equals sign", "json list", "unknown json field", "max-loras 0",
        "rank not vllm's", "modules without enable-lora"])
def test_lora_flags_vllm_refuses_are_one_line_before_serving(
        capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]) -> None:
    assert main(["sim", "serve", MODEL, "--gpu", "H100-80GB", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis sim serve: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and all(w in err for w in words), err


def test_lora_modules_are_read_as_vllms_parser_reads_them(tmp_path: Path) -> None:
    a = adapter(tmp_path / "a")
    assert lora_modules([f"sql={a}", "", '{"name": "json", "path": "/p", "base_model_name": "m"}',
                         "eq=/path/with=sign"]) == {"sql": a, "json": "/p", "eq": "/path/with=sign"}
    with pytest.raises(SimConfigError, match="Invalid JSON format"):
        lora_modules(["a=/x,b=/y"])  # a ',' makes vLLM read the item as JSON


def test_lora_flags_vllm_takes_still_start(tmp_path: Path) -> None:
    from oculis_sim.lora import from_args

    adapters, rest = from_args(["--enable-lora", "--max-loras", "2", "--max-lora-rank", "320", "--lora-modules",
                                f'{{"name": "sql", "path": "{adapter(tmp_path / "s")}"}}', "--seed", "1"], "m", {})
    assert adapters is not None and adapters.max_loras == 2 and adapters.max_lora_rank == 320
    assert list(adapters.modules) == ["sql"] and rest == ["--seed", "1"]
    assert from_args(["--max-loras", "0"], "m", {}) == (None, ["--max-loras", "0"])  # LoRA off: vLLM reads neither
