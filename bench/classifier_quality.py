"""Quality of the packaged complexity classifier on real routing outcomes (RouteLLM's protocol).

Every prompt is scored by the fold head that never saw its MMLU subject (or GSM8K bucket), so the
figures are subject-grouped out-of-fold numbers, as production traffic on new topics will see.
Prints CPT(50%), CPT(80%) and APGR with bootstrap 95% intervals per data set for: random routing,
prompt length, a rules-only baseline (length, code, reasoning and math markers), Oculis, and the
oracle. Also shows how confidence relates to weak-model errors (what escalation acts on).

Then the adaptation curve (`oculis classifier fit`): MMLU APGR against the number of in-domain labels
(0, 100, 500, 2000 spread over the 40 subjects; 2000 is about 20% of them). For each of the packaged
head's five subject folds, the fold head that never saw those subjects is the base, a random share of
the fold's rows is the suite, and the rest is scored; figures are the mean over folds and two label
draws, with a 95% bootstrap interval (test prompts resampled within each fold). Fold 4 was kept out of
every choice of the fit (penalty, pull), so it is also shown alone.

    .venv/bin/python bench/classifier_quality.py [--boot 300] [--curve-only] [--kinds-only]

With --kinds-only (or in full): the per-kind table of the shipped head, then the kind guard's table
(training/kind_guard.py): before/after APGR with 95% intervals per kind, open-ended chat (arenahard) over
eight weak/strong pairs, every row scored by a guard that never saw its kind.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training"))
from routing_data import load_llmrouter, load_rows  # noqa: E402
from routing_eval import apgr, bootstrap_apgr, cpt  # noqa: E402

from oculis_measure.eval import kinds  # noqa: E402
from oculis_router import classify  # noqa: E402
from oculis_router import head_fit as hf  # noqa: E402

CURVE_LABELS = (0, 100, 500, 800, 2000)
DRAWS = 2

CODE = re.compile(r"```|\bdef |\bclass |;\s*$|\{|\}|#include|\bSELECT\b", re.M)
REASONING = re.compile(r"\b(prove|explain why|step by step|derive|calculate|how many|why)\b", re.I)
MATH = re.compile(r"[=+*/^<>]|\d+\s*[-x\u00d7]\s*\d+")


def rules_score(text: str, n_pieces: int) -> float:
    return (np.log1p(n_pieces) + 0.5 * bool(CODE.search(text)) + 0.5 * bool(REASONING.search(text))
            + 0.5 * bool(MATH.search(text)))


def adaptation_curve(rows: list, fold_of_group: dict[str, int], boot: int) -> None:
    packaged = classify.ComplexityClassifier.packaged().head
    mmlu = [r for r in rows if r.dataset == "mmlu"]
    pieces = [classify.prompt_pieces(r.prompt) for r in mmlu]
    weak = np.array([r.weak_correct for r in mmlu])
    strong = np.array([r.strong_correct for r in mmlu])
    fold = np.array([fold_of_group[r.group] for r in mmlu])
    print("\nAdaptation curve: MMLU APGR of the fold head (never saw the subjects) after `oculis classifier fit` "
          "on N in-domain labels")
    print(f"{'labels':>7} {'mean APGR':>9}  95% CI           fold 4 (kept out of every choice)")
    for n in CURVE_LABELS:
        per_fold: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {k: [] for k in range(5)}
        for draw in range(DRAWS):
            for k in range(5):
                idx = np.nonzero(fold == k)[0]
                base = dataclasses.replace(packaged, token_weights=packaged.token_weights[[1 + k]],
                                           biases=packaged.biases[[1 + k]])
                take = round(n * len(idx) / len(mmlu))
                pick = np.random.default_rng(1000 * draw + k).permutation(idx)
                tr, te = pick[:take], pick[round(max(CURVE_LABELS) * len(idx) / len(mmlu)):]
                head = base
                if take:
                    head, _ = hf.fit_head(base, hf.Suite([pieces[i] for i in tr], weak[tr], strong[tr], None))
                score = np.array([head.raw(pieces[i].ids, pieces[i].n_len)[0] for i in te])
                per_fold[k].append((score, weak[te].astype(float), strong[te].astype(float)))
        point = np.mean([hf.apgr(*t) for k in range(5) for t in per_fold[k]])
        rng = np.random.default_rng(0)
        means = []
        for b in range(boot):
            vals = []
            for k in range(5):
                for sc, w, st in per_fold[k]:
                    i = rng.integers(0, len(sc), len(sc))
                    vals.append(hf.apgr(sc[i], w[i], st[i], b))
            means.append(np.nanmean(vals))
        lo, hi = np.percentile(means, [2.5, 97.5])
        f4 = np.mean([hf.apgr(*t) for t in per_fold[4]])
        print(f"{n:7d} {point:9.3f}  [{lo:.3f}, {hi:.3f}]   {f4:.3f}")
    print("(every N is scored on the same prompts: those no draw of the largest N could take)")


def unseen_subject_fit(rows: list, fold_of_group: dict[str, int], boot: int, labels: int = 800) -> None:
    """The issue-25 protocol: `oculis classifier fit` on `labels` rows of subjects the base never saw,
    scored on the other rows of those same subjects. Per fold: the fold head is the base, the fold's
    subjects (about 8 of 40) are the user's traffic; two label draws each."""
    packaged = classify.ComplexityClassifier.packaged().head
    mmlu = [r for r in rows if r.dataset == "mmlu"]
    pieces = [classify.prompt_pieces(r.prompt) for r in mmlu]
    weak = np.array([r.weak_correct for r in mmlu], float)
    strong = np.array([r.strong_correct for r in mmlu], float)
    fold = np.array([fold_of_group[r.group] for r in mmlu])
    print(f"\n`oculis classifier fit` on {labels} labels of unseen MMLU subjects, scored on the rest of them")
    print(f"{'fold':>5} {'subjects':>8} {'base':>6} {'fitted':>7}  95% CI of fitted")
    base_all, fit_all = [], []
    for k in range(5):
        idx = np.nonzero(fold == k)[0]
        base = dataclasses.replace(packaged, token_weights=packaged.token_weights[[1 + k]],
                                   biases=packaged.biases[[1 + k]])
        b, f, parts = [], [], []
        for draw in range(DRAWS):
            pick = np.random.default_rng(100 * draw + k).permutation(idx)
            tr, te = pick[:labels], pick[labels:]
            head, _ = hf.fit_head(base, hf.Suite([pieces[i] for i in tr], weak[tr] > 0, strong[tr] > 0, None))
            before = np.array([base.raw(pieces[i].ids, pieces[i].n_len)[0] for i in te])
            after = np.array([head.raw(pieces[i].ids, pieces[i].n_len)[0] for i in te])
            b.append(hf.apgr(before, weak[te], strong[te]))
            f.append(hf.apgr(after, weak[te], strong[te]))
            parts.append((after, weak[te], strong[te]))
        lo, hi = hf.bootstrap({"fit": np.concatenate([p[0] for p in parts])}, np.concatenate([p[1] for p in parts]),
                              np.concatenate([p[2] for p in parts]), boot)["fit"]
        n_subjects = len({mmlu[i].group for i in idx})
        print(f"{k:5d} {n_subjects:8d} {np.mean(b):6.3f} {np.mean(f):7.3f}  [{lo:.3f}, {hi:.3f}]")
        base_all += b
        fit_all += f
    print(f"{'mean':>5} {'':8} {np.mean(base_all):6.3f} {np.mean(fit_all):7.3f}  (fold 4 was kept out of every "
          "choice of the fit)")


def per_kind(rows: list, oof: np.ndarray, boot: int) -> None:
    """Every data set of ../shared/data/routing, per kind of traffic: the shipped head (on MMLU and GSM8K
    the fold head that never saw the prompt's subject or bucket; on llmrouter's task kinds, which no head
    saw, the final one), prompt length and random, as `oculis eval run` reports a suite's kinds."""
    head = classify.ComplexityClassifier.packaged().head
    sets: list[tuple[str, str, list[float], list[float], list[float], list[int]]] = []
    for d in ("mmlu", "gsm8k"):
        idx = [i for i, r in enumerate(rows) if r.dataset == d]
        sets.append(("routellm", d, [float(oof[i]) for i in idx], [float(rows[i].weak_correct) for i in idx],
                     [float(rows[i].strong_correct) for i in idx],
                     [classify.prompt_pieces(rows[i].prompt).n_len for i in idx]))
    graded = load_llmrouter()
    for kind in sorted({g.kind for g in graded}):
        gs = [g for g in graded if g.kind == kind]
        pieces = [classify.prompt_pieces(g.prompt) for g in gs]
        sets.append(("llmrouter", kind, [float(head.raw(p.ids, p.n_len)[0]) for p in pieces],
                     [g.weak for g in gs], [g.strong for g in gs], [p.n_len for p in pieces]))
    print("\nPer kind of traffic (`oculis eval run`'s report): APGR [95% CI] CPT(50%), verdict of the shipped head")
    print("routellm: Mixtral-8x7B (weak) vs GPT-4 (strong), correct or not; llmrouter: "
          "mistral-7b-instruct-v0.3 vs llama-3.1-nemotron-51b-instruct, graded 0-1; random routing 0.500")
    print(f"{'data set':9} {'kind':22} {'n':>5} {'weak':>5} {'strong':>6}  {'shipped head':30} "
          f"{'prompt length':24} {'random':24}")
    rng = np.random.default_rng(0)
    for src, kind, score, weak, strong, length in sets:
        cells = []
        for s in (score, length, rng.random(len(score)).tolist()):
            r = kinds.kind_row(kind, [kinds.Scored(kind, float(c), w, st) for c, w, st in zip(s, weak, strong,
                                                                                                strict=True)], boot)
            cells.append("-" if r.apgr is None or r.ci is None else
                         f"{r.apgr:.3f} [{r.ci[0]:.3f},{r.ci[1]:.3f}] {r.cpt50:.2f}")
            if len(cells) == 1:
                verdict = r.verdict
        print(f"{src:9} {kind:22} {len(score):5d} {np.mean(weak):5.2f} {np.mean(strong):6.2f}  "
              f"{cells[0] + ' ' + verdict:30} {cells[1]:24} {cells[2]:24}")


def guarded_per_kind(boot: int) -> None:
    """The kind guard (training/kind_guard.py): every kind of the shared data, arenahard's open-ended chat
    over eight weak/strong pairs included, before and after the guard, each scored by a guard that never
    saw its kind (scikit-learn: the `train` extra)."""
    try:
        import kind_guard
    except ImportError as exc:
        print(f"\n(per-kind table with the kind guard skipped: {exc}; `pip install -e '.[train]'`)")
        return
    items = kind_guard.load_items()
    print()
    kind_guard.report(items, kind_guard.features(items), boot)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boot", type=int, default=300)
    ap.add_argument("--curve-only", action="store_true", help="only the adaptation curve")
    ap.add_argument("--kinds-only", action="store_true", help="only the per-kind table")
    args = ap.parse_args()
    rows = load_rows()
    if args.curve_only:
        with np.load(classify.model_file(classify.DEFAULT_MODEL)) as z:
            fold_of_group = dict(zip(z["fold_groups"].tolist(), z["fold_index"].tolist(), strict=True))
        adaptation_curve(rows, fold_of_group, args.boot)
        unseen_subject_fit(rows, fold_of_group, args.boot)
        return 0
    head = classify.ComplexityClassifier.packaged().head
    z = np.load(classify.model_file(classify.DEFAULT_MODEL))
    fold_of_group = dict(zip(z["fold_groups"].tolist(), z["fold_index"].tolist(), strict=True))

    if args.kinds_only:
        oof_only = []
        for r in rows:
            p = classify.prompt_pieces(r.prompt)
            oof_only.append(head.raw(p.ids, p.n_len)[1 + fold_of_group[r.group]])
        per_kind(rows, np.array(oof_only), args.boot)
        guarded_per_kind(args.boot)
        return 0
    length, rules, oof, conf = [], [], [], []
    for r in rows:
        ids, n, u = classify.piece_ids(r.prompt)
        raw = head.raw(ids, n)
        oof.append(raw[1 + fold_of_group[r.group]])
        length.append(n)
        rules.append(rules_score(r.prompt, n))
        conf.append(head.confidence(raw, u))
    weak = np.array([r.weak_correct for r in rows], float)
    strong = np.array([r.strong_correct for r in rows], float)
    ds = np.array([r.dataset for r in rows])
    rng = np.random.default_rng(0)
    methods = {
        "random": rng.random(len(rows)),
        "prompt length": np.array(length, float),
        "rules only": np.array(rules),
        "oculis (grouped OOF)": np.array(oof),
        "oracle": (strong - weak) + 0.001 * rng.random(len(rows)),
    }
    print("Subject-grouped out-of-fold routing quality (higher APGR, lower CPT is better)")
    print(f"{'data set':8} {'method':22} {'CPT(50%)':>9} {'CPT(80%)':>9} {'APGR':>6}  95% CI")
    for d in ("mmlu", "gsm8k"):
        m = ds == d
        for name, s in methods.items():
            lo, hi = bootstrap_apgr(s[m], weak[m], strong[m], n_boot=args.boot)
            print(f"{d:8} {name:22} {cpt(s[m], weak[m], strong[m], 0.5):9.3f} {cpt(s[m], weak[m], strong[m], 0.8):9.3f}"
                  f" {apgr(s[m], weak[m], strong[m]):6.3f}  [{lo:.3f}, {hi:.3f}]")
        print(f"{d:8} n={int(m.sum())}  weak accuracy {weak[m].mean():.3f}  strong accuracy {strong[m].mean():.3f}")
    # Paired comparison against prompt length: how often does Oculis win on a resample?
    for d in ("mmlu", "gsm8k"):
        m = np.nonzero(ds == d)[0]
        wins = 0
        for i in range(args.boot):
            idx = rng.choice(m, len(m))
            wins += apgr(methods["oculis (grouped OOF)"][idx], weak[idx], strong[idx], i) > apgr(
                methods["prompt length"][idx], weak[idx], strong[idx], i)
        print(f"paired bootstrap, {d}: Oculis beats prompt length in {wins / args.boot:.0%} of resamples")
    per_kind(rows, methods["oculis (grouped OOF)"], args.boot)
    guarded_per_kind(args.boot)
    c = np.array(conf)
    low = c < 0.6
    print(f"confidence < 0.6 on {low.mean():.1%} of prompts; weak-model error rate there "
          f"{1 - weak[low].mean():.3f} vs {1 - weak[~low].mean():.3f} elsewhere")
    adaptation_curve(rows, fold_of_group, args.boot)
    unseen_subject_fit(rows, fold_of_group, args.boot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
