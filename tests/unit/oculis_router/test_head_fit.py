"""`oculis classifier fit` and the router's use of its head: fitting, writing, loading, reloading."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from numpy.typing import NDArray

from oculis_cli.main import main as cli
from oculis_router import classify
from oculis_router import head_fit as hf
from oculis_router.decide import RouteScorer
from oculis_router.metrics import Metrics
from oculis_router.state import ConfigHolder

HARD = ["torque", "entropy", "eigenvalue", "photon", "integral", "lattice"]
EASY = ["recipe", "garden", "holiday", "kitten", "picnic", "sandwich"]


def synthetic_suite(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Prompts of one length where topic words alone say whether only the strong model is right:
    the packaged head (length and its own pieces) cannot know that, a fitted one can."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        hard = i % 2 == 0
        words = rng.sample(HARD if hard else EASY, 3) + rng.sample(["what", "about", "the", "is", "a", "of"], 4)
        strong_only = (hard and rng.random() < 0.8) or (not hard and rng.random() < 0.1)
        lines.append({"prompt": " ".join(words) + "?", "outcomes": {"small": not strong_only, "big": True},
                      "group": f"g{i % 4}"})
    return lines


def write_suite(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def base() -> classify.Head:
    return classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head


def suite_of(lines: list[dict[str, Any]]) -> hf.Suite:
    pieces = [classify.payload_pieces(line) for line in lines]
    return hf.Suite(pieces, small_right(lines).astype(bool), np.ones(len(lines), bool), None)


def small_right(lines: list[dict[str, Any]]) -> NDArray[np.float64]:
    return np.array([line["outcomes"]["small"] for line in lines], dtype=np.float64)


def test_fitted_head_learns_what_the_base_cannot_and_scores_on_the_same_path(
        base: classify.Head, tmp_path: Path) -> None:
    train, test = synthetic_suite(300, 0), synthetic_suite(200, 1)
    head, _ = hf.fit_head(base, suite_of(train))
    path = tmp_path / "head.npz"
    hf.save_head(head, path)
    clf = classify.ComplexityClassifier.from_file(path, cache_ttl_seconds=0)
    base_clf = classify.ComplexityClassifier(base, cache_ttl_seconds=0)
    weak = small_right(test)
    strong = np.ones(len(test))
    fitted = np.array([clf.score_text(str(line["prompt"])).complexity for line in test])
    packaged = np.array([base_clf.score_text(str(line["prompt"])).complexity for line in test])
    assert hf.apgr(fitted, weak, strong) > max(0.65, hf.apgr(packaged, weak, strong) + 0.1)
    # The written head is the fitted one (float16 weights aside), read with numpy alone.
    p = classify.prompt_pieces(str(test[0]["prompt"]))
    np.testing.assert_allclose(classify.Head.load(path).raw(p.ids, p.n_len), head.raw(p.ids, p.n_len), rtol=1e-6)
    assert all(0 <= c <= 1 for c in fitted)
    assert 0 < clf.score_text("torque entropy photon").confidence <= 1


def test_fit_takes_seconds_on_a_few_thousand_rows(base: classify.Head) -> None:
    suite = suite_of(synthetic_suite(3000))
    start = time.process_time()
    hf.fit_head(base, suite)
    assert time.process_time() - start < 60  # the issue's budget: under a minute on one core


def test_a_file_that_is_not_a_head_is_refused_naming_file_and_fix(base: classify.Head, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no such file; write one with `oculis classifier fit"):
        classify.load_head_file(tmp_path / "missing.npz")
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=r"junk\.npz: not a classifier head"):
        classify.load_head_file(junk)
    small = tmp_path / "small.npz"
    head, _ = hf.fit_head(base, suite_of(synthetic_suite(100)))
    from dataclasses import replace

    hf.save_head(replace(head, token_weights=head.token_weights[:, :100]), small)
    with pytest.raises(ValueError, match=r"not a head for this router's tokenizer \(token_weights is"):
        classify.load_head_file(small)


def test_grouped_folds_keep_each_group_whole() -> None:
    groups = np.array([f"s{i % 7}" for i in range(70)])
    fold = hf.folds_of(70, groups, 5, 0)
    for g in set(groups):
        assert len(set(fold[groups == g])) == 1
    assert len(set(fold)) == 5


def test_cli_fits_reports_base_vs_fitted_and_the_route_serves_the_head(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    suite = write_suite(tmp_path / "suite.jsonl", synthetic_suite(200))
    head = tmp_path / "heads" / "mine.npz"
    rc = cli(["classifier", "fit", "--suite", str(suite), "--weak", "small", "--strong", "big", "--out", str(head),
              "--boot", "20"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "random folds" in out and "grouped folds (4 groups" in out and "fitted beats base" in out
    assert "classifier: {head_path:" in out
    assert "the fitted head is better by grouped cross-validation" in out and ": the fitted head" in out
    # A standalone config names it relative to the config file.
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "u", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "routes": [{"name": "r", "classifier": {"head_path": "heads/mine.npz", "cache_ttl_seconds": 0},
                    "tiers": [{"name": "a", "match": {"complexity_below": 0.5}, "upstream": "u"},
                              {"name": "b", "upstream": "u"}]}]}}))
    holder = ConfigHolder(cfg, Metrics())
    scorer = holder.current.routes["r"].scorer
    assert scorer.head_file == head
    hard, _ = scorer.score({"prompt": "torque entropy photon what is the?"})
    easy, _ = scorer.score({"prompt": "recipe garden kitten what is the?"})
    assert hard.complexity > easy.complexity


def test_router_reloads_a_replaced_head_and_keeps_the_old_one_when_the_new_is_bad(tmp_path: Path) -> None:
    head = tmp_path / "head.npz"
    base = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head
    hf.save_head(hf.fit_head(base, suite_of(synthetic_suite(200)))[0], head)
    cfg = tmp_path / "oculis-config.yaml"
    cfg.write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "u", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "routes": [{"name": "r", "classifier": {"head_path": str(head), "cache_ttl_seconds": 0},
                    "tiers": [{"name": "a", "upstream": "u"}]}]}}))
    metrics = Metrics()
    holder = ConfigHolder(cfg, metrics)
    prompt = {"prompt": "torque entropy photon what is the?"}
    before = holder.current.routes["r"].scorer.score(prompt)[0].complexity
    # The same prompts with the labels flipped: topic words now mean "easy".
    flipped = [{**line, "outcomes": {"small": not line["outcomes"]["small"], "big": True}}
               for line in synthetic_suite(200)]
    hf.save_head(hf.fit_head(base, suite_of(flipped))[0], head)
    assert holder.reload() is True
    after = holder.current.routes["r"].scorer.score(prompt)[0].complexity
    assert after < before
    head.write_bytes(b"garbage")
    assert holder.reload() is False
    assert holder.current.routes["r"].scorer.score(prompt)[0].complexity == after
    assert holder.reload() is False  # a bad head is said once, not every tick
    assert (metrics.registry.get_sample_value("oculis_config_reloads_total", {"result": "rejected"}) or 0) == 1


def test_a_missing_head_at_start_names_the_route_and_the_fix(tmp_path: Path) -> None:
    from oculis import ConfigError, parse_config

    text = yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "u", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "routes": [{"name": "r", "classifier": {"head_path": str(tmp_path / "nope.npz")},
                    "tiers": [{"name": "a", "upstream": "u"}]}]}})
    with pytest.raises(ConfigError, match=r"routes\[r\]\.classifier\.head_path: .*nope\.npz: no such file"):
        ConfigHolder(None, Metrics(), config=parse_config(text, "x"))
    with pytest.raises(ValueError, match="no such file"):
        RouteScorer(parse_config(text, "x").routes[0])


@pytest.mark.parametrize(("line", "message"), [
    ({"prompt": "hi", "outcomes": {"big": True}}, r"line 1: outcomes has no 'small' \(--weak\); it has big"),
    ({"outcomes": {"small": True, "big": True}}, r"line 1: needs \"prompt\""),
])
def test_cli_names_the_bad_suite_line_and_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   line: dict[str, object], message: str) -> None:
    suite = write_suite(tmp_path / "s.jsonl", [line])
    rc = cli(["classifier", "fit", "--suite", str(suite), "--weak", "small", "--strong", "big",
              "--out", str(tmp_path / "h.npz")])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert __import__("re").search(message, err), err


def test_inference_route_takes_the_head_from_a_config_map_and_renders_its_mount_path() -> None:
    from oculis.inferenceroute import InferenceRouteSpec
    from oculis_operator.routeconfig import render_namespace

    spec = {"classifier": {"headFrom": {"configMapKeyRef": {"name": "heads", "key": "support.npz"}}},
            "tiers": [{"name": "a", "upstream": "up"}]}
    InferenceRouteSpec.model_validate(spec)
    with pytest.raises(ValueError, match=r"use classifier\.headFrom\.configMapKeyRef"):
        InferenceRouteSpec.model_validate({**spec, "classifier": {"headPath": "/x.npz"}})
    route = {"metadata": {"name": "support", "namespace": "ns", "uid": "1"}, "spec": spec}
    up = {"metadata": {"name": "up", "namespace": "ns"}, "spec": {"provider": "vllm", "model": "m"},
          "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    out = render_namespace([route], [up])
    doc = yaml.safe_load(out.data["oculis-config.yaml"])["oculis"]
    assert doc["routes"][0]["classifier"] == {"head_path": "/etc/oculis-heads/heads/support.npz",
                                              "cache_ttl_seconds": 3600, "max_entries": 100000}
