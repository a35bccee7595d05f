"""A relative classifier.head_path means the same file to `oculis route score/analyze`, `oculis eval run`
and the router: the config file's folder, whatever the working directory."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from oculis import parse_config
from oculis_cli.main import main
from oculis_router import classify
from oculis_router import head_fit as hf
from oculis_router.decide import RouteScorer

SEED = Path(__file__).resolve().parents[3] / "examples" / "oculis-config.yaml"
PROMPT = "Prove that there are infinitely many primes and explain each step."


@pytest.fixture
def layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(config file, a working directory elsewhere); the head, shifted from the packaged one, sits beside
    the config as heads/fit.npz."""
    head = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head
    hf.save_head(replace(head, biases=head.biases + 1.5), tmp_path / "cfg" / "heads" / "fit.npz")
    doc = yaml.safe_load(SEED.read_text())
    route = next(r for r in doc["oculis"]["routes"] if r["name"] == "adaptive")
    route.setdefault("classifier", {})["head_path"] = "heads/fit.npz"
    config = tmp_path / "cfg" / "oculis-config.yaml"
    config.write_text(yaml.safe_dump(doc))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return config, elsewhere


def routers_score(config: Path) -> float:
    route = parse_config(config.read_text(), str(config)).route("adaptive")
    return RouteScorer(route, config.parent).score({"prompt": PROMPT})[0].complexity


def test_route_score_reads_a_relative_head_beside_the_config_as_the_router_does(layout: tuple[Path, Path]) -> None:
    config, elsewhere = layout
    proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "route", "score", "--config", str(config),
                           "--route", "adaptive"], input=json.dumps({"prompt": PROMPT}) + "\n", cwd=elsewhere,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)["complexity"]
    assert got == pytest.approx(routers_score(config))
    packaged = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).score_text(PROMPT).complexity
    assert got != pytest.approx(packaged)  # the fitted head, not the packaged one


def test_eval_run_reads_a_relative_head_beside_the_config(layout: tuple[Path, Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    config, elsewhere = layout
    route = parse_config(config.read_text(), str(config)).route("adaptive")
    suite = elsewhere / "suite.jsonl"
    suite.write_text(json.dumps({"prompt": PROMPT, "outcomes": {t.upstream: True for t in route.tiers}}) + "\n")
    code = main(["eval", "run", "--config", str(config), "--route", "adaptive", "--suite", str(suite), "-o", "json"])
    err = capsys.readouterr().err
    assert code != 2 and "head_path" not in err, err


def test_a_missing_head_names_the_head_path_field(layout: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
                                                  ) -> None:
    config, _ = layout
    (config.parent / "heads" / "fit.npz").unlink()
    from oculis_cli.route import route_scorer

    route = parse_config(config.read_text(), str(config)).route("adaptive")
    with pytest.raises(ValueError, match=r"routes\[adaptive\]\.classifier\.head_path: "):
        route_scorer(route, config)


def test_the_fit_hint_names_a_head_path_the_router_finds_from_any_config_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    (work / "heads").mkdir(parents=True)
    monkeypatch.chdir(work)
    lines = [{"prompt": f"question {i}: " + "explain the proof step by step " * (i % 7),
              "outcomes": {"weak": i % 7 < 3, "strong": True}} for i in range(60)]
    Path("suite.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    code = main(["classifier", "fit", "--suite", "suite.jsonl", "--weak", "weak", "--strong", "strong",
                 "--out", "heads/fit.npz", "--no-cv"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    hint = next(line for line in printed.splitlines() if "head_path:" in line)
    head_path = hint.split("head_path: ", 1)[1].split("}", 1)[0]
    config_dir = tmp_path / "configs" / "prod"  # the config lives elsewhere than the fit's working directory
    from oculis_router.decide import head_file

    assert head_file(head_path, config_dir) == (work / "heads" / "fit.npz").resolve()
