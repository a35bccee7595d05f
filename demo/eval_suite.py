"""Writes the demo's offline `oculis eval run` suite to stdout: real outcomes of two real models on MMLU
(../shared/data/routing: Mixtral-8x7B as the cheap tier, GPT-4 as the strong one), the first PER_SUBJECT
prompts of every subject, minus the contaminated ones. Without that folder it prints the committed
demo/eval-suite.jsonl (62 lines of the same data), so a fresh checkout still has a suite."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "routing" / "mmlu"
WEAK, STRONG = "mistralai/Mixtral-8x7B-Instruct-v0.1", "gpt-4-1106-preview"
PER_SUBJECT = 20


def main() -> None:
    if not DATA.is_dir():
        sys.stdout.write((HERE / "eval-suite.jsonl").read_text())
        return
    drop = set()
    contaminated = DATA / "contaminated_prompts.jsonl"
    if contaminated.exists():
        drop = {json.loads(line)["eval_prompt"] for line in contaminated.read_text().splitlines() if line.strip()}
    csv.field_size_limit(10_000_000)
    for path in sorted(DATA.glob("mmlu_*.csv")):
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["prompt"] not in drop][:PER_SUBJECT]
        for r in rows:
            # Outcomes keyed by upstream: demo/eval-config.yaml names the upstreams after these two models.
            outcomes = {"mixtral": r[WEAK] == "True", "gpt4": r[STRONG] == "True"}
            print(json.dumps({"prompt": r["prompt"], "outcomes": outcomes, "group": path.stem}))


if __name__ == "__main__":
    main()
