"""An upstream's key from its variable or its file (a self-hosted engine's, from the mounted Secret): a
relative file is taken from OCULIS_ENGINE_KEYS_DIR, re-read on every call; missing is said as the router's
fault, naming the file, never the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from oculis import Upstream
from oculis_router.upstream_keys import key_of, missing_key


def up(**kw: str) -> Upstream:
    return Upstream.model_validate({"name": "llama", "provider": "vllm", "base_url": "http://e:8000/v1", **kw})


def test_a_relative_key_file_is_read_from_the_keys_dir_each_call(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OCULIS_ENGINE_KEYS_DIR", str(tmp_path))
    u = up(api_key_file="llama")
    assert key_of(u) is None and "its API key file " + str(tmp_path / "llama") in (missing_key(u) or "")
    (tmp_path / "llama").write_text("k1\n")
    assert key_of(u) == "k1" and missing_key(u) is None
    (tmp_path / "llama").write_text("k2")  # rotated in place (kubelet's atomic Secret update)
    assert key_of(u) == "k2"
    assert key_of(up(api_key_file=str(tmp_path / "llama"))) == "k2"  # absolute: as given
    assert "k2" not in (missing_key(up(api_key_file="other")) or "")


def test_the_variable_and_the_file_are_exclusive() -> None:
    with pytest.raises(ValueError, match="api_key_env and api_key_file both"):
        up(api_key_env="X", api_key_file="llama")
