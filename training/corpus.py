"""Unlabelled text from outside the routing split, for distilling the teacher's judgement (issue 14).

The shared split holds only MMLU and GSM8K prompts. A head fitted on them alone learns nothing about
words those prompts never use, which is where chat traffic lives (writing, role play, code). The
teacher (MiniLM's contextual embedding + logistic regression) can score any text, so the student
head is fitted to the teacher's scores on this corpus as well: no labels, only the teacher's view.

Sources, both offline and deterministic:
- WordNet 3.0 glosses (Debian `wordnet-base`, /usr/share/wordnet): definitions and example
  sentences over general English, single ones and runs of 2-8 from one lexicographer file (one
  topic, a prompt-like length);
- the docstrings of this Python's standard library: code and technical prose. They change a little
  between Python releases, so a rerun on another Python may write a slightly different head.
"""

from __future__ import annotations

import ast
import random
import sysconfig
from pathlib import Path

WORDNET = Path("/usr/share/wordnet")
POS = ("noun", "verb", "adj", "adv")


class CorpusMissing(RuntimeError):
    pass


def wordnet_glosses(root: Path = WORDNET) -> dict[tuple[str, str], list[str]]:
    """Glosses by (part of speech, lexicographer file), in file order."""
    by_lex: dict[tuple[str, str], list[str]] = {}
    for pos in POS:
        path = root / f"data.{pos}"
        if not path.exists():
            raise CorpusMissing(f"{path} is missing: install WordNet 3.0 (apt-get install wordnet-base)")
        for line in path.read_text(encoding="latin-1").splitlines():
            if line.startswith("  ") or "|" not in line:  # the licence header, indented
                continue
            gloss = line.split("|", 1)[1].strip().replace('"', "")
            if len(gloss) >= 20:
                by_lex.setdefault((pos, line.split()[1]), []).append(gloss)
    return by_lex


def stdlib_docstrings() -> list[str]:
    out = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 40:
                    out.append(" ".join(doc.split())[:1500])
    return out


def corpus(singles: int = 16_000, runs: int = 8_000, docs: int = 4_000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    by_lex = wordnet_glosses()
    keys = sorted(by_lex)
    texts = rng.sample([g for k in keys for g in by_lex[k]], singles)
    for _ in range(runs):
        pool = by_lex[rng.choice(keys)]
        texts.append(". ".join(rng.sample(pool, min(len(pool), rng.randint(2, 8)))))
    found = stdlib_docstrings()
    texts += rng.sample(found, min(docs, len(found)))
    return texts
