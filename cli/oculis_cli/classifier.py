"""`oculis classifier fit`: a complexity head fitted on your own labelled outcomes.

The suite is `oculis eval run`'s offline format, one JSON object per line:
`{"prompt": str}` or `{"messages": [...]}`, `"outcomes": {"<upstream>": true|false, ...}`, and
optionally `"group"` (a topic or subject: the report then also shows how the head does on topics it
was not fitted on). The fit starts from the packaged head (or `--base FILE`) and keeps its per-request
path; it prints cross-validated APGR (RouteLLM's routing quality; random routing 0.5) of the base (as the
router serves it) and the fitted head on the suite, with 95% bootstrap intervals, and writes the fitted head
only when it is better by that cross-validation (grouped folds where lines name groups; higher APGR and a
win in 90% of paired resamples); otherwise it writes the base unchanged, so adapting never makes a route
worse than the shipped default on the user's own rows (`--no-cv` writes the fitted head unchecked).
A route uses the head with `classifier: {head_path: FILE}`; the router reloads the file when it changes.
Exit codes: 0 written, 1 the fit failed, 2 bad arguments or suite (one line naming the problem).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

USAGE = 2


class FitInputError(ValueError):
    pass


def register(sub: Any) -> None:
    cls = sub.add_parser("classifier", help="fit the router's complexity classifier on your own outcomes")
    cls_sub = cls.add_subparsers(dest="classifier_command", required=True, metavar="COMMAND")
    fit = cls_sub.add_parser("fit", help="fit a head on a labelled suite; prints base vs fitted APGR")
    fit.add_argument("--suite", required=True, type=Path, help="JSON lines: prompt or messages, outcomes, [group]")
    fit.add_argument("--weak", required=True, help="the cheap upstream's name in `outcomes`")
    fit.add_argument("--strong", required=True, help="the strong upstream's name in `outcomes`")
    fit.add_argument("--out", required=True, type=Path, help="head file to write (.npz)")
    fit.add_argument("--base", default="default",
                     help="head to start from: `default` (the packaged one) or a head file")
    fit.add_argument("--penalty", type=float, default=None,
                     help="L2 on the per-piece corrections (default: the one chosen on the shared split)")
    fit.add_argument("--boot", type=int, default=300, help="bootstrap resamples for the intervals (default 300)")
    fit.add_argument("--no-cv", action="store_true", help="skip the cross-validated report (fit only)")
    fit.set_defaults(run=run_fit)


def read_suite(path: Path, weak: str, strong: str) -> tuple[list[dict[str, Any]], list[bool], list[bool],
                                                            list[str] | None]:
    """Payloads, outcomes of the two upstreams and groups; FitInputError naming the line and the fix."""
    from oculis_measure.eval.core import SuiteLineError, parse_line

    if weak == strong:
        raise FitInputError(f"--weak and --strong are both {weak!r}; name two different upstreams")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FitInputError(f"--suite {path}: cannot read it ({type(exc).__name__}: {exc})") from None
    payloads, w, s, groups = [], [], [], []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = parse_line(lineno, line, offline=True)
        except SuiteLineError as exc:
            raise FitInputError(f"--suite {path}: {exc}") from None
        outcomes = item.outcomes or {}
        for name, flag in ((weak, "--weak"), (strong, "--strong")):
            if name not in outcomes:
                known = ", ".join(sorted(outcomes))
                raise FitInputError(f"--suite {path}: line {lineno}: outcomes has no {name!r} ({flag}); it has "
                                    f"{known}; add \"{name}\": true|false or pass the right {flag}")
        group = json.loads(line).get("group")
        payloads.append(item.payload)
        w.append(outcomes[weak])
        s.append(outcomes[strong])
        groups.append(str(group) if isinstance(group, str | int) and not isinstance(group, bool) else "")
    return payloads, w, s, (groups if all(groups) and len(set(groups)) > 1 else None)


def run_fit(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    out = stdout or sys.stdout
    try:
        import numpy as np

        from oculis_router import classify
        from oculis_router import head_fit as hf
    except ImportError as exc:  # scipy/numpy/tokenizers: the router and bench extras
        print(f"oculis classifier fit: needs the router's classifier and scipy ({exc}); install "
              "`pip install 'oculis[router,bench]'`", file=sys.stderr)
        return USAGE
    try:
        payloads, weak_l, strong_l, groups = read_suite(args.suite, args.weak, args.strong)
        if args.base == "default":
            base = classify.ComplexityClassifier.packaged(cache_ttl_seconds=0).head
        else:
            try:
                base = classify.load_head_file(Path(args.base))
            except ValueError as exc:
                raise FitInputError(f"--base {exc} (or `--base default` for the packaged head)") from None
        weak, strong = np.array(weak_l), np.array(strong_l)
        if args.penalty is not None and not args.penalty > 0:
            raise FitInputError(f"--penalty {args.penalty}: must be a positive number, e.g. 0.013")
        if len(payloads) < hf.MIN_ROWS:
            raise FitInputError(f"--suite {args.suite}: {len(payloads)} labelled prompts; a fit needs at least "
                                f"{hf.MIN_ROWS} (a few hundred to see a gain)")
        if not (strong & ~weak).any():
            raise FitInputError(f"--suite {args.suite}: on no prompt is {args.strong} right and {args.weak} wrong, "
                                "so there is nothing to route to the strong model; check --weak/--strong")
    except (FitInputError, ValueError) as exc:
        print(f"oculis classifier fit: {exc}", file=sys.stderr)
        return USAGE
    t0 = time.perf_counter()
    suite = hf.Suite([classify.payload_pieces(p) for p in payloads], weak, strong,
                     None if groups is None else np.array(groups))
    penalty = hf.PENALTY if args.penalty is None else args.penalty
    head, final = hf.fit_head(base, suite, penalty)
    took = time.perf_counter() - t0
    print(f"fitted on {len(payloads)} prompts ({int((strong & ~weak).sum())} where only {args.strong} is right; "
          f"penalty {final.penalty:g}) in {took:.1f} s", file=out)
    chosen = head
    if args.no_cv:
        print("not checked against the base (--no-cv): wrote the fitted head", file=out)
    else:
        served = np.array([served_complexity(classify.ComplexityClassifier(base, cache_ttl_seconds=0), p)
                           for p in payloads])
        label, scores = report(hf, base, suite, penalty, args.boot, out, served)
        choice = hf.choose(scores["base"], scores["fitted"], weak.astype(float), strong.astype(float), label,
                           args.boot)
        print(choice.reason, file=out)
        chosen = base if choice.keep_base else head
    hf.save_head(chosen, args.out)
    size = args.out.stat().st_size
    print(f"wrote {args.out} ({size // 1024} KiB, sha256 {hf.head_digest(args.out)}): "
          f"{'the base head' if chosen is base else 'the fitted head'}", file=out)
    print(use_hint(args.out), file=out)
    return 0


def served_complexity(clf: Any, payload: dict[str, Any]) -> float:
    """The base head's complexity of a suite line as the router serves it (its kind guard included)."""
    if isinstance(payload.get("messages"), list):
        return float(clf.score_messages(payload["messages"]).complexity)
    prompt = payload.get("prompt", "")
    text = "\n".join(str(p) for p in prompt) if isinstance(prompt, list) else str(prompt)
    return float(clf.score_text(text).complexity)


def use_hint(written: Path) -> str:
    """How to point a route at the head just written. The router looks a relative head_path up in the
    config file's folder, not in the working directory `--out` was relative to, so the hint names the
    absolute path (right wherever the config lives)."""
    return (f"use it in a route: classifier: {{head_path: {written.resolve()}}} (or a path relative to the "
            "config file's folder)")


def report(hf: Any, base: Any, suite: Any, penalty: float, boot: int, out: TextIO, served: Any
           ) -> tuple[str, dict[str, Any]]:
    """Prints base (as served) vs fitted by cross-validation; returns the scores the choice is made on:
    grouped folds where lines name groups (new topics), else random folds."""
    z = hf.design(base, suite.pieces)
    w, s = suite.weak.astype(float), suite.strong.astype(float)
    print("cross-validated APGR on this suite (5 folds; random routing 0.5; 95% bootstrap CI):", file=out)
    kinds = [("random folds (this suite's topics)", False)]
    if suite.groups is not None:
        kinds.append((f"grouped folds ({len(set(suite.groups))} groups; new topics)", True))
    chosen: tuple[str, dict[str, Any]] = ("random-fold", {})
    for label, grouped in kinds:
        scores = hf.cross_validate(z, suite, grouped, penalty) | {"base": served}
        ci = hf.bootstrap(scores, w, s, boot)
        print(f"  {label}", file=out)
        for name, sc in scores.items():
            lo, hi = ci[name]
            print(f"    {name:14} {hf.apgr(sc, w, s):.3f}  [{lo:.3f}, {hi:.3f}]", file=out)
        wins = hf.paired_wins(scores["fitted"], scores["base"], w, s, boot)
        print(f"    fitted beats base in {wins:.0%} of paired resamples", file=out)
        if grouped and wins < 0.5:
            print("    on topics left out of the fit the fitted head does worse than the base: use it for traffic "
                  "like the suite, and refit as topics change", file=out)
        chosen = ("grouped" if grouped else "random-fold", scores)
    return chosen
