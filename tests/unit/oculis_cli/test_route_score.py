"""`oculis route score`: one JSON line out per line in, in order, on the router's own path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"


def score(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "oculis_cli.main", "route", "score", *args]
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60)


def test_scores_prompts_and_messages_in_order() -> None:
    lines = [
        {"prompt": "hi"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2+2?"}]},
        {"prompt": "Which of the following best describes the role of the Golgi apparatus?\n"
                   "A. Protein modification\nB. ATP synthesis\nC. DNA replication\nD. Lipid digestion" * 8},
    ]
    proc = score("\n".join(json.dumps(x) for x in lines) + "\n", "--config", str(SEED), "--route", "adaptive")
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert len(out) == 3
    for o in out:
        assert set(o) == {"complexity", "confidence", "tier"}
        assert 0 <= o["complexity"] <= 1 and 0 <= o["confidence"] <= 1
    assert out[0]["tier"] == "simple"
    assert out[2]["complexity"] > out[0]["complexity"]


def test_bad_lines_keep_their_place_and_fail_the_run() -> None:
    proc = score('{"prompt": "a"}\nnot json\n{"x": 1}\n{"messages": "nope"}\n{"prompt": "b"}\n',
                 "--config", str(SEED), "--route", "adaptive")
    assert proc.returncode == 1
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [("error" in o) for o in out] == [False, True, True, True, False]
    assert out[2]["error"] == "line 3: expected `prompt` (string) or `messages` (list)"
    assert "Traceback" not in proc.stderr


def test_unknown_route_and_bad_config_exit_2_with_the_cause(tmp_path: Path) -> None:
    proc = score("", "--config", str(SEED), "--route", "nope")
    assert proc.returncode == 2
    assert "unknown route 'nope'; routes in this config: adaptive" in proc.stderr
    bad = tmp_path / "c.yaml"
    bad.write_text("oculis:\n  routes: []\n")
    proc = score("", "--config", str(bad), "--route", "adaptive")
    assert proc.returncode == 2 and "oculis.upstreams: Field required" in proc.stderr
    proc = score("", "--config", str(tmp_path / "missing.yaml"), "--route", "adaptive")
    assert proc.returncode == 2 and "cannot read config" in proc.stderr
    assert "Traceback" not in proc.stderr
