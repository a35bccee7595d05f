"""`oculis epp` refuses what it cannot serve in one line, exit 2, before binding anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from oculis_cli.main import main

CONFIG = {"oculis": {"upstreams": [
    {"name": "llama", "provider": "vllm", "model": "m", "endpoints": ["http://127.0.0.1:9/v1"]},
    {"name": "gpt", "provider": "openai", "model": "gpt-4o", "api_key_env": "OCULIS_TEST_UNSET_KEY"}],
    "routes": [{"name": "hosted", "tiers": [{"name": "only", "match": {}, "upstream": "gpt"}]}]}}


@pytest.mark.parametrize(("args", "says"), [
    (["--upstream", "gpt"], "--upstream 'gpt' is an external provider (openai)"),
    (["--upstream", "nope"], "--upstream 'nope' is not an upstream of the config (it has: gpt, llama)"),
    (["--route", "nope"], "--route 'nope' is not a route of the config (it has: hosted)"),
    (["--route", "hosted"], "--route 'hosted' has only external-provider tiers"),
    (["--upstream", "llama", "--fallbacks", "-1"], "--fallbacks -1 is negative"),
    (["--upstream", "llama", "--shed-waiting", "0"], "--shed-waiting 0 must be positive"),
])
def test_a_target_it_cannot_serve_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     args: list[str], says: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    assert main(["epp", "--config", str(cfg), *args, "--port", "0", "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oculis epp: ") and says in err and err.count("\n") == 1, err


def test_a_config_that_does_not_load_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("oculis: {upstreams: [{name: x}]}")
    assert main(["epp", "--config", str(cfg), "--upstream", "x"]) == 2
    err = capsys.readouterr().err
    assert "provider" in err and err.count("\n") == 1, err
    assert main(["epp", "--config", str(tmp_path / "missing.yaml"), "--upstream", "x"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
