"""The selection script's distilled-head candidate (training/head_distill.py, corpus.py): the pure
parts, on small synthetic inputs. Needs scikit-learn (the `train` extra); skipped without it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "training"))
from skips import TRAIN_FIX, needs_modules  # noqa: E402

pytestmark = needs_modules("sklearn", install=TRAIN_FIX)


def test_distil_recovers_per_piece_weights_from_the_teachers_logit() -> None:
    from head_distill import distil, mean_pool

    rng = np.random.default_rng(0)
    vocab, dims = 200, 16
    static = rng.normal(size=(vocab, dims))
    truth = rng.normal(size=vocab)
    texts = [rng.integers(0, vocab, rng.integers(3, 30)) for _ in range(3000)]
    pool = mean_pool(texts, vocab)
    target = np.asarray(pool @ truth) + 0.5
    w, b = distil(pool, target, static, damp=0.01)
    fitted = np.asarray(pool @ w) + b
    assert np.corrcoef(fitted, target)[0, 1] > 0.99
    # A text no fit saw is scored through the same weights: the mean over its pieces.
    unseen = [rng.integers(0, vocab, 10) for _ in range(200)]
    p2 = mean_pool(unseen, vocab)
    assert np.corrcoef(np.asarray(p2 @ w) + b, np.asarray(p2 @ truth))[0, 1] > 0.95


def test_mean_pool_averages_each_texts_pieces() -> None:
    from head_distill import mean_pool

    table = np.arange(12, dtype=float).reshape(6, 2)
    pooled = np.asarray(mean_pool([np.array([0, 2]), np.array([5]), np.array([1, 1, 4])], 6) @ table)
    np.testing.assert_allclose(pooled, [table[[0, 2]].mean(0), table[5], table[[1, 1, 4]].mean(0)])


def test_the_teacher_is_a_logit_that_ranks_the_labelled_direction() -> None:
    from head_distill import logistic_logit

    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 8))
    y = (x[:, 0] + 0.3 * rng.normal(size=500) > 0).astype(np.int64)
    logit = logistic_logit(x, y)(x)
    assert np.corrcoef(logit, x[:, 0])[0, 1] > 0.9


def test_the_corpus_reads_wordnet_glosses_and_names_the_package_when_absent(tmp_path: Path) -> None:
    from corpus import CorpusMissing, wordnet_glosses

    with pytest.raises(CorpusMissing, match="apt-get install wordnet-base"):
        wordnet_glosses(tmp_path)
    header = "  1 This software and database is being provided to you, the LICENSEE, by\n"
    for pos in ("noun", "verb", "adj", "adv"):
        (tmp_path / f"data.{pos}").write_text(
            header + f"00001740 03 {pos[0]} 01 entity 0 003 | that which is perceived to have its own distinct "
            f'existence; "a {pos} example"\n'
            "00001741 05 n 01 x 0 000 | too short\n", encoding="latin-1")
    got = wordnet_glosses(tmp_path)
    assert list(got) == [("noun", "03"), ("verb", "03"), ("adj", "03"), ("adv", "03")]
    assert got[("noun", "03")] == ["that which is perceived to have its own distinct existence; a noun example"]
