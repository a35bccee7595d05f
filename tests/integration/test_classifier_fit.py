"""`oculis classifier fit` on real routing outcomes: subjects the base head never saw, a fifth of their
labels, scored on the other four fifths (RouteLLM's in-domain-labels setting).

The packaged head keeps five fold heads, each trained without one fold of MMLU subjects. For each
fold, that fold head is the base (it never saw those subjects); the command fits on 20% of their rows
and the fitted head must route the remaining 80% better than the base. Needs ../shared/data/routing/.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from oculis_router import classify
from oculis_router import head_fit as hf

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "training"))
from routing_data import data_dir, load_rows  # type: ignore[import-not-found]  # noqa: E402
from skips import ROUTING_DATA_FIX, needs_path  # noqa: E402

pytestmark = needs_path(data_dir(), "the routing data", ROUTING_DATA_FIX)


def test_fitted_head_beats_the_base_on_subjects_it_never_saw(tmp_path: Path) -> None:
    rows = [r for r in load_rows() if r.dataset == "mmlu"]
    packaged = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head
    with np.load(classify.model_file(classify.DEFAULT_MODEL)) as z:
        fold_of = dict(zip(z["fold_groups"].tolist(), z["fold_index"].tolist(), strict=True))
    results = []
    for k in range(5):
        base_path, head_path, suite_path = tmp_path / f"base{k}.npz", tmp_path / f"fit{k}.npz", tmp_path / f"s{k}.jsonl"
        base = replace(packaged, token_weights=packaged.token_weights[[1 + k]], biases=packaged.biases[[1 + k]])
        hf.save_head(base, base_path)
        unseen = [r for r in rows if fold_of[r.group] == k]
        pick = np.random.default_rng(k).random(len(unseen)) < 0.2
        lines = [{"prompt": r.prompt, "group": r.group,
                  "outcomes": {"mixtral": r.weak_correct, "gpt-4": r.strong_correct}}
                 for r, p in zip(unseen, pick, strict=True) if p]
        suite_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        proc = subprocess.run([sys.executable, "-m", "oculis_cli.main", "classifier", "fit", "--suite", str(suite_path),
                               "--weak", "mixtral", "--strong", "gpt-4", "--out", str(head_path), "--base",
                               str(base_path), "--no-cv"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        rest = [r for r, p in zip(unseen, pick, strict=True) if not p]
        weak = np.array([r.weak_correct for r in rest], float)
        strong = np.array([r.strong_correct for r in rest], float)
        scored = {}
        for name, path in (("base", base_path), ("fitted", head_path)):
            clf = classify.ComplexityClassifier.from_file(path, cache_ttl_seconds=0)
            scored[name] = np.array([clf.head.raw(p.ids, p.n_len)[0] for p in
                                     (classify.prompt_pieces(r.prompt) for r in rest)])
        results.append((hf.apgr(scored["base"], weak, strong), hf.apgr(scored["fitted"], weak, strong)))
    got = np.array(results)
    print("per fold (base, fitted):", np.round(got, 3).tolist(), "mean", np.round(got.mean(axis=0), 3).tolist())
    assert got[:, 1].mean() > got[:, 0].mean() + 0.01
    assert (got[:, 1] > got[:, 0]).sum() >= 4
