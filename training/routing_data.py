"""Loads `../shared/data/routing/` (per-prompt correctness of a strong and a weak model on MMLU and
GSM8K) into rows for training and evaluating the complexity classifier.

Groups: each MMLU subject is one group, so grouped folds hold out whole subjects as production
traffic will; GSM8K rows fall into random groups (seeded), as there are no topics to leak.

Holdout (`is_holdout`): a fixed part of the split that no modelling choice may see, fixed before any
candidate was scored by a seeded rule: `random.Random(HOLDOUT_SEED)` samples 8 of the 40 MMLU subjects
(sorted by name) and then 2 of the 8 GSM8K buckets. Choices are made by grouped CV on the rest (`dev`);
the holdout is scored once per candidate, to check the choice, never to make it.
"""

from __future__ import annotations

import csv
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

WEAK = "mistralai/Mixtral-8x7B-Instruct-v0.1"
STRONG = "gpt-4-1106-preview"
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "routing"
GSM8K_GROUPS = 8
HOLDOUT_SEED = 2014
HOLDOUT_SUBJECTS, HOLDOUT_GSM8K = 8, 2


@dataclass(frozen=True, slots=True)
class Row:
    prompt: str
    dataset: str  # "mmlu" | "gsm8k"
    group: str  # MMLU subject, or a random GSM8K bucket
    weak_correct: bool
    strong_correct: bool


def data_dir() -> Path:
    return Path(os.environ.get("OCULIS_ROUTING_DATA", DEFAULT_DIR))


def _contaminated(path: Path) -> set[str]:
    if not path.exists():
        return set()
    return {json.loads(line)["eval_prompt"] for line in path.read_text().splitlines() if line.strip()}


def load_rows(root: Path | None = None) -> list[Row]:
    root = root or data_dir()
    if not root.exists():
        raise SystemExit(f"routing data not found at {root}; set OCULIS_ROUTING_DATA to the data/routing folder")
    csv.field_size_limit(10_000_000)
    rows: list[Row] = []
    drop = _contaminated(root / "mmlu" / "contaminated_prompts.jsonl")
    for path in sorted((root / "mmlu").glob("mmlu_*.csv")):
        subject = path.stem.removeprefix("mmlu_")
        with path.open(newline="") as f:
            for rec in csv.DictReader(f):
                if rec["prompt"] in drop:
                    continue
                rows.append(Row(rec["prompt"], "mmlu", subject, rec[WEAK] == "True", rec[STRONG] == "True"))
    drop = _contaminated(root / "gsm8k" / "contaminated_prompts.jsonl")
    rng = random.Random(0)
    with (root / "gsm8k" / "gsm8k_responses.csv").open(newline="") as f:
        for rec in csv.DictReader(f):
            if rec["prompt"] in drop:
                continue
            group = f"gsm8k-{rng.randrange(GSM8K_GROUPS)}"
            rows.append(Row(rec["prompt"], "gsm8k", group, rec[WEAK] == "True", rec[STRONG] == "True"))
    return rows


def holdout_groups(rows: list[Row]) -> frozenset[str]:
    """The groups of the fixed holdout (see the module docstring)."""
    rng = random.Random(HOLDOUT_SEED)
    subjects = sorted({r.group for r in rows if r.dataset == "mmlu"})
    picked = rng.sample(subjects, HOLDOUT_SUBJECTS)
    picked += [f"gsm8k-{i}" for i in rng.sample(range(GSM8K_GROUPS), HOLDOUT_GSM8K)]
    return frozenset(picked)


def is_holdout(rows: list[Row]) -> list[bool]:
    held = holdout_groups(rows)
    return [r.group in held for r in rows]


# ../shared/data/routing/llmrouter (MIT): nine other models on fourteen task kinds. The pair routed
# between is the README's widest: a 7B model as the weak one, a 51B one as the strong.
LLMROUTER_WEAK, LLMROUTER_STRONG = "mistral-7b-instruct-v0.3", "llama-3.1-nemotron-51b-instruct"


@dataclass(frozen=True, slots=True)
class Graded:
    """A prompt with both models' graded scores (0-1: exact match, F1, tests passed...)."""

    prompt: str
    kind: str  # the task kind (llmrouter's task_name)
    split: str  # train | test
    weak: float
    strong: float


def _jsonl(path: Path) -> list[dict[str, object]]:
    # Split on \n only: some queries hold other line breaks (the data's README).
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def load_llmrouter(root: Path | None = None) -> list[Graded]:
    root = (root or data_dir()) / "llmrouter"
    if not root.exists():
        raise SystemExit(f"llmrouter data not found at {root}; set OCULIS_ROUTING_DATA to the data/routing folder")
    kinds = {str(q["query"]): str(q["task_name"]) for split in ("train", "test")
             for q in _jsonl(root / f"default_query_{split}.jsonl")}
    out = []
    for split in ("train", "test"):
        for rec in json.loads((root / f"{split}.json").read_text()):
            scores = rec["scores"]
            out.append(Graded(rec["question"], kinds.get(rec["question"], "unknown"), split,
                              float(scores[LLMROUTER_WEAK]), float(scores[LLMROUTER_STRONG])))
    return out
