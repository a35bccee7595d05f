"""Fixtures: fake upstreams and a router over real HTTP on 127.0.0.1, driven by the openai SDK."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
# e2e_support's `eventually` serves these tests too: one waiting helper for the whole suite.
sys.path.insert(1, str(Path(__file__).resolve().parents[2] / "e2e" / "tests"))
from fake_upstreams import Server
from router_support import Fakes, RouterHandle

from oculis_router.app import build_app


@pytest.fixture(scope="session")
def fakes() -> Iterator[Fakes]:
    f = Fakes()
    for s in f.servers.values():
        s.__enter__()
    yield f
    for s in f.servers.values():
        s.__exit__()


@pytest.fixture(autouse=True)
def reset_scripts(fakes: Fakes) -> None:
    for script in fakes.scripts.values():
        script.__init__()  # type: ignore[misc]  # the servers hold these objects: reset in place


@pytest.fixture
def router(fakes: Fakes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RouterHandle]:
    monkeypatch.setenv("OCULIS_TEST_OPENAI_KEY", "sk-openai-SECRET-1234")
    monkeypatch.setenv("OCULIS_TEST_ANTHROPIC_KEY", "sk-ant-SECRET-5678")
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(fakes.config()))
    app = build_app(config_path=path, reload_interval=0.1, backoff=0.001)
    with Server(app) as server:
        yield RouterHandle(path, server, app)
