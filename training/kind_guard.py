"""The kind guard: which prompts the packaged head has evidence for, and the coin it falls back to elsewhere.

The head ranks MMLU- and GSM8K-like prompts better than a coin (subject-grouped CV), but on open-ended
chat (arenahard; an unseen 805-prompt chat set: 0.447) and on several of llmrouter's kinds (ARC,
CommonsenseQA, OpenBookQA, GPQA, MATH, HumanEval) it ranks worse than one: there its length signal
points the wrong way for many weak/strong pairs (measured: training/kind_guard.py --report). A guard in
front of it is a bag-of-pieces logistic regression (one weight per word piece, the head's own cost):
kinds where the head's APGR interval lies above 0.5 are "in evidence", every other kind of the shared data
(arenahard's chat included) is not. Outside the evidence the complexity is a hash of the prompt, uniform
in [0, 1]: deterministic per prompt, and a coin in expectation at every strong-call share (APGR 0.5).

Measured, never fitted, on the kind it is scored on: every kind of the shared data is scored by a guard
trained without that kind (leave-one-kind-out); MMLU by guards trained without its subject's fold;
arenahard by five prompt folds, over several weak/strong pairs of its fourteen graded models.

    .venv/bin/python training/kind_guard.py            # fit on everything, write into the packaged head
    .venv/bin/python training/kind_guard.py --report   # the cross-validated per-kind table only
(the `train` extra: scikit-learn)
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from routing_data import data_dir, load_llmrouter, load_rows
from scipy import sparse
from sklearn.linear_model import LogisticRegression

from oculis_router import classify

# Kinds where the shipped head's APGR interval lies above 0.5 (bench/classifier_quality.py --kinds-only).
EVIDENCE = {"mmlu", "gsm8k"}
C = 1.0  # inverse L2 strength (checked: 0.3-3 give the same per-kind table within noise)
ARENA_PAIRS = (("Mixtral-8x7B-Instruct-v0.1", "gpt-4-turbo"), ("gpt-3.5-turbo", "gpt-4-turbo"),
               ("Llama-2-70b-chat", "gpt-4-0314"), ("Mistral-7B-Instruct-v0.1", "gpt-3.5-turbo"),
               ("vicuna-33b-v1.3", "claude-2.1"), ("claude-instant-1", "gpt-4-turbo"),
               ("openchat_3.5", "gpt-4-0314"), ("Starling-LM-7B-alpha", "gpt-3.5-turbo-1106"))


@dataclass(frozen=True)
class Item:
    prompt: str
    kind: str  # mmlu | gsm8k | llmrouter:<task> | chat
    group: str  # what CV holds out together
    outcomes: dict[str, float]


def load_items() -> list[Item]:
    items = [Item(r.prompt, r.dataset, r.group, {"weak": float(r.weak_correct), "strong": float(r.strong_correct)})
             for r in load_rows()]
    items += [Item(g.prompt, f"llmrouter:{g.kind}", f"llmrouter:{g.kind}", {"weak": g.weak, "strong": g.strong})
              for g in load_llmrouter()]
    path = data_dir() / "arenahard" / "arena_bench_v1.jsonl"
    for i, line in enumerate(path.read_text().splitlines()):
        rec = json.loads(line)
        items.append(Item(rec["prompt"], "chat", f"chat-{i % 5}", {k: v / 10 for k, v in rec["scores"].items()}))
    return items


def features(items: list[Item]) -> sparse.csr_matrix:
    """Mean one-hot of the prompt's pieces: a linear model on it is one weight per piece plus a bias."""
    vocab = classify.load_tokenizer().get_vocab_size()
    rows, cols, vals = [], [], []
    for i, it in enumerate(items):
        ids = classify.prompt_pieces(it.prompt).ids
        if len(ids):
            rows += [i] * len(ids)
            cols += ids.tolist()
            vals += [1.0 / len(ids)] * len(ids)
    return sparse.csr_matrix((vals, (rows, cols)), shape=(len(items), vocab))


def fit_guard(x: sparse.csr_matrix, items: list[Item], idx: np.ndarray) -> tuple[np.ndarray, float]:
    """Each kind weighs the same within its class (MMLU's 10 000 rows would drown 300 chat prompts), and the
    two classes the same in total (13 kinds out of evidence would otherwise push MMLU of an unseen subject
    out of it); chat, the traffic most platforms carry, is half of the out-of-evidence class."""
    kinds = np.array([items[i].kind for i in idx])
    y = np.array([k in EVIDENCE for k in kinds])
    counts = {k: int((kinds == k).sum()) for k in set(kinds)}
    per_class = {c: sum(1 for k in counts if (k in EVIDENCE) == c) for c in (True, False)}
    share = {k: 1 / per_class[k in EVIDENCE] for k in counts}
    if "chat" in counts:  # the kind most traffic is: half of its class's weight
        share = {k: 0.5 if k == "chat" else v * 0.5 * per_class[False] / (per_class[False] - 1) if k not in EVIDENCE
                 else v for k, v in share.items()}
    w = np.array([len(idx) * share[k] / (2 * counts[k]) for k in kinds])
    lr = LogisticRegression(C=C, max_iter=2000).fit(x[idx], y, sample_weight=w)
    return lr.coef_[0].astype(np.float32), float(lr.intercept_[0])


def cv_in_evidence(x: sparse.csr_matrix, items: list[Item], fold_of_group: dict[str, int]) -> np.ndarray:
    """Out-of-kind guard decisions: MMLU/GSM8K by the head's own subject folds, every llmrouter kind
    left out whole, arenahard by its five prompt folds."""
    out = np.zeros(len(items), bool)
    holdouts: list[np.ndarray] = []
    kinds = np.array([it.kind for it in items])
    groups = np.array([it.group for it in items])
    for f in range(5):
        holdouts.append(np.nonzero(np.isin(groups, [g for g, k in fold_of_group.items() if k == f]))[0])
    for k in sorted(set(kinds) - {"mmlu", "gsm8k", "chat"}):
        holdouts.append(np.nonzero(kinds == k)[0])
    for f in range(5):
        holdouts.append(np.nonzero(groups == f"chat-{f}")[0])
    for te in holdouts:
        tr = np.setdiff1d(np.arange(len(items)), te)
        w, b = fit_guard(x, items, tr)
        out[te] = (x[te] @ w + b) >= 0
    return out


def report(items: list[Item], x: sparse.csr_matrix, boot: int) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from oculis_measure.eval import kinds as kr

    head = classify.ComplexityClassifier.packaged().head
    with np.load(classify.model_file(classify.DEFAULT_MODEL)) as z:
        fold_of_group = dict(zip(z["fold_groups"].tolist(), z["fold_index"].tolist(), strict=True))
    inside = cv_in_evidence(x, items, fold_of_group)
    before, after = np.empty(len(items)), np.empty(len(items))
    for i, it in enumerate(items):
        p = classify.prompt_pieces(it.prompt)
        raw = head.raw(p.ids, p.n_len)
        col = 1 + fold_of_group[it.group] if it.kind in ("mmlu", "gsm8k") else 0  # never saw the subject
        before[i] = float(head.complexity(raw[col:col + 1])[0])
        short = len(p.ids) < classify.GUARD_MIN_PIECES  # the guard does not judge these (classify.py)
        after[i] = before[i] if inside[i] or short else classify.coin(it.prompt)
    print("Per kind: APGR [95% CI] of the shipped head (before) and the guarded head (after); the guard of each "
          "row never saw its kind (MMLU/GSM8K: its subject fold; chat: its prompt fold)")
    print(f"{'kind':28} {'n':>5} {'in evidence':>11}  {'before':24} {'after':24}")
    for kind in sorted({it.kind for it in items}):
        idx = [i for i, it in enumerate(items) if it.kind == kind]
        pairs = ARENA_PAIRS if kind == "chat" else (("weak", "strong"),)
        for wk, st in pairs:
            use = [i for i in idx if wk in items[i].outcomes and st in items[i].outcomes]
            cells = []
            for s in (before, after):
                r = kr.kind_row(kind, [kr.Scored(kind, float(s[i]), items[i].outcomes[wk], items[i].outcomes[st])
                                       for i in use], boot)
                cells.append("-" if r.apgr is None or r.ci is None else f"{r.apgr:.3f} [{r.ci[0]:.3f},{r.ci[1]:.3f}]")
            label = kind if kind != "chat" else f"chat {wk[:12]}/{st[:12]}"
            print(f"{label:28} {len(use):5d} {np.mean(inside[use]):11.2f}  {cells[0]:24} {cells[1]:24}")


def write_guard(w: np.ndarray, b: float, path: Path) -> None:
    """Adds (or replaces) guard_weights/guard_bias in the packaged head, leaving its other arrays as they are."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if k not in ("guard_weights", "guard_bias")}
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, guard_weights=w.astype(np.float16), guard_bias=np.float64(b))
    path.write_bytes(buf.getvalue())
    zipfile.ZipFile(path).testzip()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", action="store_true", help="only the cross-validated per-kind table")
    ap.add_argument("--boot", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None,
                    help="folder holding the head to add the guard to (default: the packaged head)")
    args = ap.parse_args()
    items = load_items()
    x = features(items)
    if args.report:
        report(items, x, args.boot)
        return 0
    w, b = fit_guard(x, items, np.arange(len(items)))
    target = classify.model_file(classify.DEFAULT_MODEL)
    if args.out is not None:
        target = args.out / target.name
    write_guard(w, b, target)
    print(f"guard written into {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
