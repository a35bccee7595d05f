"""`oculis sim serve --help` did not mention --enable-lora, --max-loras, --max-lora-rank or --lora-modules
(read from the rest of the argv as vLLM reads them), though README documents them (QA pass 3): the help
lists every flag the LoRA reader takes, with vLLM's ranks."""

import pytest

from oculis.adapters import VLLM_LORA_RANKS
from oculis_sim.cli import build_parser
from oculis_sim.lora import FLAGS, RUNTIME_ENV


def test_sim_serve_help_lists_every_lora_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    assert all(flag in text for flag in FLAGS) and RUNTIME_ENV in text, text
    assert ", ".join(map(str, VLLM_LORA_RANKS)) in text
