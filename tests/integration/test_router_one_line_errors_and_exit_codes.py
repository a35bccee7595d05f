"""Every way `oculis serve` can be refused at start is one line naming the field, the value and the
fix, and exit 2, never a traceback (QA pass 2, findings 2 and 30): what the schema accepts but the
router cannot build (a classifier head missing or not a head, a decision-log sink that is a folder or
cannot be written, a Redis URL redis-py refuses) is checked when the config is loaded, so a pod says
why in one line instead of crash-looping with a traceback, and a hot reload rejects it the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_upstreams import free_port


def config(tmp_path: Path, route: dict[str, Any], server: dict[str, Any] | None = None) -> Path:
    doc: dict[str, Any] = {"oculis": {
        "upstreams": [{"name": "ok", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "ok"}],
        "routes": [{"name": "r", **route}]}}
    if server:
        doc["oculis"]["server"] = server
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


TWO_TIERS = [{"name": "a", "match": {"complexity_below": 0.5}, "upstream": "ok"}, {"name": "b", "upstream": "ok"}]
ONE_TIER = [{"name": "a", "upstream": "ok"}]
CASES = {
    "missing head": ({"classifier": {"head_path": "missing.npz"}, "tiers": TWO_TIERS}, None,
                     "routes[r].classifier.head_path", "no such file"),
    "garbage head": ({"classifier": {"head_path": "garbage.npz"}, "tiers": TWO_TIERS}, None,
                     "routes[r].classifier.head_path", "not a classifier head"),
    "decision log in a folder": ({"decision_log": {"sink": "/"}, "tiers": ONE_TIER}, None,
                                 "routes[r].decision_log.sink", "is a directory"),
    "decision log unwritable": ({"decision_log": {"sink": "/proc/nope/decisions.jsonl"}, "tiers": ONE_TIER}, None,
                                "routes[r].decision_log.sink", "cannot be written"),
    "redis url of another scheme": ({"tiers": ONE_TIER, "cache": {"enabled": True}},
                                    {"cache_backend": "redis", "redis_url": "http://redis:6379"},
                                    "server.redis_url", "the scheme must be one of"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_serve_refuses_what_it_cannot_build_in_one_line_with_exit_2(tmp_path: Path, case: str) -> None:
    route, server, field, why = CASES[case]
    (tmp_path / "garbage.npz").write_text("garbage\n")
    path = config(tmp_path, route, server)
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "serve", "--config", str(path), "--port",
                           str(free_port()), "--metrics-port", str(free_port())],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("oculis serve: ") and field in lines[0] and why in lines[0], lines[0]


def test_a_hot_reload_rejects_an_unwritable_decision_log_naming_the_field(tmp_path: Path) -> None:
    from oculis_router.metrics import Metrics
    from oculis_router.state import ConfigHolder

    path = config(tmp_path, {"tiers": ONE_TIER})
    holder = ConfigHolder(path, Metrics())
    config(tmp_path, {"decision_log": {"sink": str(tmp_path)}, "tiers": ONE_TIER})
    holder.tick()
    assert holder.rejected is not None and "routes[r].decision_log.sink" in holder.rejected.reason
    assert holder.current.routes["r"].route.decision_log is None  # the previous config keeps serving
