"""`oculis classifier fit` keeps the shipped head as the prior: the fitted head is written only when
cross-validation on the user's rows shows it better; both are printed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from oculis_cli.main import main as cli
from oculis_router import classify
from oculis_router import head_fit as hf


def test_choose_takes_the_fitted_head_only_when_it_wins_the_paired_resamples() -> None:
    rng = np.random.default_rng(0)
    weak = (rng.random(400) < 0.5).astype(float)
    strong = np.ones(400)
    good = (1 - weak) + 0.1 * rng.random(400)  # ranks the weak model's failures first
    coin = rng.random(400)
    assert not hf.choose(coin, good, weak, strong, "grouped", 100).keep_base
    kept = hf.choose(good, coin, weak, strong, "grouped", 100)
    assert kept.keep_base and "kept the base" in kept.reason and kept.fitted_apgr < kept.base_apgr
    same = hf.choose(coin, coin + 1e-9, weak, strong, "grouped", 100)
    assert same.keep_base  # a tie is no evidence
    assert hf.choose(coin, good, strong, strong, "grouped", 100).keep_base  # no gap: nothing to learn


def test_cli_keeps_the_base_when_the_fit_does_not_beat_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(0)
    words = ["recipe", "garden", "torque", "photon", "holiday", "lattice", "what", "is", "the", "of"]
    lines = [{"prompt": " ".join(rng.sample(words, 5)) + "?", "group": f"g{i % 4}",
              "outcomes": {"small": rng.random() < 0.5, "big": True}} for i in range(160)]  # labels are noise
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out_path = tmp_path / "head.npz"
    rc = cli(["classifier", "fit", "--suite", str(suite), "--weak", "small", "--strong", "big", "--out",
              str(out_path), "--boot", "50"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "base" in out and "fitted" in out and "kept the base, wrote it unchanged" in out
    assert "the base head" in out
    packaged = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head
    written = classify.load_head_file(out_path)
    np.testing.assert_allclose(written.token_weights, packaged.token_weights.astype(np.float16), rtol=1e-3)
    assert (written.guard_weights is None) == (packaged.guard_weights is None)
