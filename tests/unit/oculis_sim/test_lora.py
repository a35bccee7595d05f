"""The simulator's LoRA adapters: loading checks what it can see as vLLM 0.32 does (the real engine's answers
are held against these in tests/realengine/test_lora_real.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oculis_sim.api_request import media_type_error
from oculis_sim.config import SimConfigError
from oculis_sim.lora import Adapters, adapter_problem, from_args, sanitized


def adapter(folder: Path, **config: object) -> Path:
    folder.mkdir(parents=True)
    cfg = {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"], "bias": "none", **config}
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def test_an_adapters_config_is_checked_as_vllm_checks_it(tmp_path: Path) -> None:
    assert adapter_problem(str(adapter(tmp_path / "sql")), 8) is None
    (tmp_path / "empty").mkdir()
    a = Adapters("tiny", 1, 8)
    status, body = a.load({"lora_name": "ghost", "lora_path": str(tmp_path / "empty")})
    assert status == 404 and isinstance(body, dict) and body["error"]["type"] == "NotFoundError"
    assert body["error"]["message"] == "Loading lora ghost failed: No adapter found for <path>"  # vLLM hides /tmp
    wide = adapter_problem(str(adapter(tmp_path / "wide", r=16)), 8)
    assert wide is not None and (wide.status, wide.err_type) == (500, "InternalServerError")
    assert wide.message == ("Call to add_lora method failed: Worker failed with error 'LoRA rank 16 is greater "
                            "than max_lora_rank 8.', please check the stack trace above for the root cause")
    patterned = adapter_problem(str(adapter(tmp_path / "p", rank_pattern={"q_proj": 32})), 16)
    assert patterned is not None and "LoRA rank 32 is greater than max_lora_rank 16." in patterned.message


def test_vllms_message_sanitizer() -> None:
    assert sanitized("No adapter found for /tmp/a/b") == "No adapter found for <path>"
    assert sanitized("No adapter found for /adapters/sql") == "No adapter found for /adapters/sql"
    assert sanitized("bad /x/y/adapter_config.json") == "bad <path>"


def test_the_request_models_fields_are_validated_as_vllm_does() -> None:
    a = Adapters("tiny", 1)
    status, body = a.load({"lora_name": "x"})
    assert status == 400 and isinstance(body, dict)
    assert body["error"]["type"] == "Bad Request" and body["error"]["param"] == "body.lora_path"
    assert body["error"]["message"].startswith("1 validation error:\n  {'type': 'missing', 'loc': 'body.lora_path'")
    status, body = a.load({})
    assert status == 400 and isinstance(body, dict) and body["error"]["message"].startswith("2 validation errors:")
    status, body = a.load({"lora_name": 7, "lora_path": "/p"})
    assert isinstance(body, dict) and "'type': 'string_type'" in body["error"]["message"]
    status, body = a.unload({"lora_name": ""})
    assert status == 400 and isinstance(body, dict) and body["error"]["type"] == "InvalidUserInput"


def test_a_static_adapter_it_cannot_load_stops_the_start(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SimConfigError, match=r"--lora-modules ghost=.*No adapter found"):
        from_args(["--enable-lora", "--lora-modules", f"ghost={tmp_path / 'empty'}"], "tiny", {})
    with pytest.raises(SimConfigError, match=r"--lora-modules wide=.*LoRA rank 16 is greater than max_lora_rank 8"):
        from_args(["--enable-lora", "--max-lora-rank", "8", "--lora-modules", f"wide={adapter(tmp_path / 'w', r=16)}"],
                  "tiny", {})
    # a local path that does not exist is vLLM's refusal too (QA3 Part 2 #10: it was served as loaded) ...
    with pytest.raises(SimConfigError, match=r"--lora-modules sql=/nonexistent: No adapter found for /nonexistent"):
        from_args(["--enable-lora", "--lora-modules", "sql=/nonexistent"], "tiny", {})
    # ... unless the sandbox's pod stand-in says the paths are the pod's volumes (not on this machine)
    adapters, rest = from_args(["--enable-lora", "--max-lora-rank", "8", "--lora-modules", "sql=/adapters/sql"],
                               "tiny", {"OCULIS_SIM_POD_PATHS": "1"})
    assert adapters is not None and adapters.max_lora_rank == 8 and adapters.modules == {"sql": "/adapters/sql"}
    assert rest == []
    # a Hugging Face id is taken as fetched (the simulator downloads nothing), unless offline, as vLLM finds it
    assert from_args(["--enable-lora", "--lora-modules", "hf=org/sql-lora"], "tiny", {})[0] is not None
    with pytest.raises(SimConfigError, match="No adapter found for org/sql-lora"):
        from_args(["--enable-lora", "--lora-modules", "hf=org/sql-lora"], "tiny", {"HF_HUB_OFFLINE": "1"})


def test_a_body_not_declared_json_is_refused_as_vllm_refuses_it() -> None:
    assert media_type_error("application/json; charset=utf-8") is None
    err = media_type_error("text/plain")
    assert err is not None and (err.status, err.err_type, err.param) == (400, "Bad Request", None)
    assert err.message == "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"
