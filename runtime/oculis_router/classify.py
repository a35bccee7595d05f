"""The prompt-complexity classifier: how likely a prompt needs the strong model, and how sure we are.

Signal, not decision: it returns a `Classification`; tier choice lives in `decide.py`.

How it scores (trained by `training/train_classifier.py`, data in `classifier_data/`):
- the prompt is cut to word pieces by all-MiniLM-L6-v2's tokenizer;
- a distilled static MiniLM table, folded together with a logistic-regression head into one weight
  per word piece, gives the embedding signal as a mean over the prompt's pieces;
- it is blended with the prompt's length (a strong baseline on real routing data) and mapped
  through the training score distribution, so complexity is a calibrated quantile in [0, 1]
  (0.35 means "harder than 35% of the training prompts");
- confidence drops when the fold heads, each trained without some topics, disagree on the prompt,
  and when many of its pieces are unknown to the tokenizer (other scripts, noise).
One tokenisation, a gather and a few means: well under a millisecond on a 500-token prompt.
A head fitted on a user's own outcomes (`oculis classifier fit`, `head_fit.py`) has the same format
and is scored by the same path; `load_head_file` checks one before a route uses it.
"""

from __future__ import annotations

import hashlib
import math
import threading
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from cachetools import TTLCache
from numpy.typing import NDArray
from tokenizers import Tokenizer

from oculis.router import CLASSIFIER_MODEL, classifier_name
from oculis_router.content import content_text

DEFAULT_MODEL = CLASSIFIER_MODEL  # the schema's one name for the packaged head
# Bounds on work per prompt: tokenisation is linear in text length, so very long prompts are cut
# (the length signal still sees an estimate of the whole prompt).
MAX_CHARS = 24_000
CONTEXT_TOKENS = 128  # earlier turns contribute at most this many pieces
# A content part the classifier cannot read (an image, audio, a file) counts as this many prompt
# tokens: about what OpenAI bills for a 1024x1024 image at high detail. The pieces are "unknown", so
# such prompts get low confidence (escalate) instead of scoring as empty text on the cheapest tier.
MEDIA_PART_TOKENS = 765
MEDIA_PARTS = ("image_url", "input_audio", "file")
NO_TEXT = "no text"
# Below this many word pieces the kind guard does not judge: a bag of pieces says little about the kind of
# a one-line turn ("hi", "What is 2+2?"), and the head's score stands (the cheapest tier, as before the
# guard). No arenahard prompt is this short, so the guard's measured chat figures are unaffected.
GUARD_MIN_PIECES = 8


@dataclass(frozen=True, slots=True)
class Classification:
    complexity: float
    confidence: float
    prompt_tokens: int = 0  # word pieces in the whole prompt (estimated beyond the cut)


@dataclass(frozen=True, slots=True)
class Head:
    """The trained head, as written by the training script."""

    token_weights: NDArray[np.float32]  # (1 + folds, vocab): row 0 the final head, then one per fold
    biases: NDArray[np.float64]  # (1 + folds,)
    len_mu: float
    len_sd: float
    emb_mu: float
    emb_sd: float
    blend: float  # weight of the embedding signal; 1 - blend goes to length
    knots: NDArray[np.float64]  # raw-score quantiles at 0, 0.01, ..., 1
    spread_ref: float  # 90th percentile of fold disagreement (in complexity) on training prompts
    meta: dict[str, Any]
    # The kind guard (training/kind_guard.py): one weight per piece and a bias; a prompt whose mean weight
    # plus bias is below 0 is of a kind the head has no evidence for, and gets `coin` as its complexity.
    # None: no guard (heads fitted on a user's own outcomes, which are that user's evidence).
    guard_weights: NDArray[np.float32] | None = None
    guard_bias: float = 0.0

    def raw(self, ids: NDArray[np.int64], n_pieces: int) -> NDArray[np.float64]:
        """Uncalibrated scores of the final head (index 0) and of each fold head."""
        len_z = (math.log1p(n_pieces) - self.len_mu) / self.len_sd
        emb = self.token_weights[:, ids].mean(axis=1, dtype=np.float64) + self.biases
        out: NDArray[np.float64] = (1 - self.blend) * len_z + self.blend * (emb - self.emb_mu) / self.emb_sd
        return out

    def complexity(self, raw: NDArray[np.float64]) -> NDArray[np.float64]:
        """Calibrated: the share of training prompts scoring below."""
        out: NDArray[np.float64] = np.interp(raw, self.knots, np.linspace(0.0, 1.0, len(self.knots)))
        return out

    def in_evidence(self, ids: NDArray[np.int64]) -> bool:
        """Whether the prompt is of a kind the head was shown to rank better than a coin."""
        if self.guard_weights is None or len(ids) < GUARD_MIN_PIECES:
            return True
        return float(self.guard_weights[ids].mean(dtype=np.float64)) + self.guard_bias >= 0

    def confidence(self, raw: NDArray[np.float64], unknown_share: float) -> float:
        """High when the fold heads (each blind to some topics) agree on the complexity and the
        prompt's pieces are known; 0.6 is crossed by about 10% of training prompts."""
        spread = float(self.complexity(raw[1:]).std()) if len(raw) > 2 else 0.0
        return min(1.0, max(0.0, 1.0 - 0.4 * spread / self.spread_ref) * (1.0 - unknown_share))

    @classmethod
    def load(cls, path: Path) -> Head:
        with np.load(path, allow_pickle=False) as z:
            scalars = {k: float(z[k]) for k in ("len_mu", "len_sd", "emb_mu", "emb_sd", "blend", "spread_ref")}
            meta = {k.removeprefix("meta_"): str(z[k]) for k in z.files if k.startswith("meta_")}
            guard = "guard_weights" in z.files
            return cls(
                token_weights=z["token_weights"].astype(np.float32),
                biases=z["biases"].astype(np.float64),
                knots=z["knots"].astype(np.float64),
                meta=meta,
                guard_weights=z["guard_weights"].astype(np.float32) if guard else None,
                guard_bias=float(z["guard_bias"]) if guard else 0.0,
                **scalars,
            )


def coin(text: str) -> float:
    """A complexity for a prompt the head has no evidence on: uniform in [0, 1] over prompts and fixed per
    prompt (a digest, not a draw: retries and replicas route alike). Sending the prompts at or above any
    threshold to the strong model is then a coin at every strong-call share: APGR 0.5 in expectation, never
    the below-random ranking the head's length signal gives open-ended chat. Of the last turn only, as the
    head's score is mostly: a long earlier conversation does not re-draw it."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"),
                             digest_size=8, person=b"oculis-coin").digest()
    return int.from_bytes(digest, "big") / 2**64


def data_path(name: str) -> Path:
    return Path(str(resources.files("oculis_router") / "classifier_data" / name))


def model_file(model: str) -> Path:
    """The packaged head of a classifier name (the schema's name: `oculis/router-small-v2` is
    `oculis-router-small-v2.npz`)."""
    return data_path(model.replace("/", "-") + ".npz")


@cache
def load_tokenizer() -> Tokenizer:
    tok = Tokenizer.from_file(str(data_path("tokenizer.json")))
    tok.no_truncation()
    tok.no_padding()
    return tok


def piece_ids(text: str) -> tuple[NDArray[np.int64], int, float]:
    """Word-piece ids of `text` (bounded), an estimate of its full length in pieces, and the
    share of unknown pieces."""
    tok = load_tokenizer()
    cut = text[:MAX_CHARS]
    ids = np.asarray(tok.encode(cut, add_special_tokens=False).ids, dtype=np.int64)
    n = len(ids)
    if len(text) > len(cut) and n:
        n = round(n * len(text) / len(cut))
    unk = float(np.mean(ids == _unk_id())) if len(ids) else 0.0
    return ids, n, unk


@cache
def _unk_id() -> int:
    unk = load_tokenizer().token_to_id("[UNK]")
    if unk is None:
        raise RuntimeError("the packaged tokenizer has no [UNK] piece; reinstall oculis")
    return unk


class ComplexityClassifier:
    """Scores prompts; thread-safe; memoises scores for `cache_ttl_seconds`."""

    def __init__(self, head: Head, cache_ttl_seconds: float = 3600, max_entries: int = 100_000) -> None:
        self.head = head
        self._memo: TTLCache[bytes, Classification] | None = (
            TTLCache(maxsize=max_entries, ttl=cache_ttl_seconds) if cache_ttl_seconds > 0 and max_entries else None
        )
        self._lock = threading.Lock()

    @classmethod
    def packaged(cls, model: str | None = None, cache_ttl_seconds: float = 3600,
                 max_entries: int = 100_000) -> ComplexityClassifier:
        name = classifier_name(model or DEFAULT_MODEL)  # an alias, or an unknown name listing the known
        path = model_file(name)
        if not path.exists():
            raise ValueError(f"classifier {name!r} is not packaged with this router; reinstall oculis")
        return cls(_load_head(path), cache_ttl_seconds, max_entries)

    @classmethod
    def from_file(cls, path: Path, cache_ttl_seconds: float = 3600, max_entries: int = 100_000) -> ComplexityClassifier:
        """A head written by `oculis classifier fit`; ValueError naming the file and the fix."""
        return cls(load_head_file(path), cache_ttl_seconds, max_entries)

    def score_text(self, text: str, context: str = "") -> Classification:
        # Keyed by a digest, not the text: a memo of full prompts held ~3 MB per long prompt (100 000
        # of them would be gigabytes); a 16-byte digest bounds each entry to a few hundred bytes.
        # The context's length goes first so no (context, text) split can collide with another.
        key = hashlib.blake2b(f"{len(context)}:{context}{text}".encode("utf-8", "surrogatepass"),
                              digest_size=16).digest()
        if self._memo is not None:
            with self._lock:
                hit = self._memo.get(key)
            if hit is not None:
                return hit
        result = self._score(text, context)
        if self._memo is not None:
            with self._lock:
                self._memo[key] = result
        return result

    def score_messages(self, messages: list[dict[str, Any]]) -> Classification:
        text, context = split_messages(messages)
        media = media_parts(messages)
        # Not memoised with media: the text alone would be the wrong key, and images are rare.
        return self._score(text, context, media) if media else self.score_text(text, context)

    def _score(self, text: str, context: str, media: int = 0) -> Classification:
        h = self.head
        p = prompt_pieces(text, context, media)
        if not p.unreadable and not text.strip():
            return Classification(0.0, 1.0, p.total)  # nothing to misjudge: the cheapest tier
        if len(p.ids):
            raw = h.raw(p.ids, p.n_len)
        else:  # media only: the length signal alone, the embedding at its training mean
            raw = np.full(len(h.biases), (1 - h.blend) * (math.log1p(p.unreadable) - h.len_mu) / h.len_sd)
        complexity = float(h.complexity(raw[:1])[0]) if h.in_evidence(p.ids) else coin(text)
        return Classification(round(complexity, 4), round(h.confidence(raw, p.unk), 4), p.total)


@dataclass(frozen=True, slots=True)
class Pieces:
    """What a head sees of a prompt: the one definition that serving and `oculis classifier fit` share."""

    ids: NDArray[np.int64]  # the last turn's pieces, then at most CONTEXT_TOKENS of earlier turns
    n_len: int  # the length signal's input: the last turn's pieces plus unreadable media
    total: int  # the whole prompt's pieces (context included), for token limits
    unk: float  # share of pieces the classifier cannot read
    unreadable: int  # tokens counted for media parts


def prompt_pieces(text: str, context: str = "", media: int = 0) -> Pieces:
    ids, n_pieces, unk = piece_ids(text)
    unreadable = media * MEDIA_PART_TOKENS
    total = n_pieces + unreadable
    if context:
        tail = context[-CONTEXT_TOKENS * 8 :]
        ctx_ids, n_tail, _ = piece_ids(tail)
        total += round(n_tail * len(context) / max(len(tail), 1))
        ids = np.concatenate([ids, ctx_ids[-CONTEXT_TOKENS:]])
    unk = (unk * n_pieces + unreadable) / max(n_pieces + unreadable, 1)
    return Pieces(ids, n_pieces + unreadable, total, unk, unreadable)


def payload_pieces(payload: dict[str, Any]) -> Pieces:
    """A request body's (or suite line's) `messages` or `prompt`, as the router reads it."""
    if isinstance(payload.get("messages"), list):
        text, context = split_messages(payload["messages"])
        return prompt_pieces(text, context, media_parts(payload["messages"]))
    prompt = payload.get("prompt", "")
    if isinstance(prompt, list):
        prompt = "\n".join(str(p) for p in prompt)
    return prompt_pieces(prompt if isinstance(prompt, str) else "")


def split_messages(messages: list[dict[str, Any]]) -> tuple[str, str]:
    """The last user turn, and the text of earlier turns (most recent last) as bounded context."""
    texts = [(m.get("role", ""), content_text(m.get("content"))) for m in messages if isinstance(m, dict)]
    last = max((i for i, (role, _) in enumerate(texts) if role == "user"), default=len(texts) - 1)
    if last < 0:
        return "", ""
    context = "\n".join(t for _, t in texts[:last] if t)
    return texts[last][1], context


def media_parts(messages: list[dict[str, Any]]) -> int:
    """Content parts of the conversation the classifier cannot read."""
    return sum(1 for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
               for p in m["content"] if isinstance(p, dict) and p.get("type") in MEDIA_PARTS)


@cache
def _load_head(path: Path) -> Head:
    return Head.load(path)


HEAD_FIX = "write one with `oculis classifier fit --out FILE`"


def load_head_file(path: Path) -> Head:
    """Loads and checks a user's head. Not memoised by path: the file is replaced in place when a
    ConfigMap or a new fit updates it, and the router reloads it."""
    try:
        head = Head.load(path)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file; {HEAD_FIX}") from None
    except (OSError, ValueError, KeyError) as exc:  # not an npz, or one without a head's arrays
        raise ValueError(f"{path}: not a classifier head ({type(exc).__name__}: {exc}); {HEAD_FIX}") from None
    vocab = load_tokenizer().get_vocab_size()
    w, b, k = head.token_weights, head.biases, head.knots
    scalars = (head.len_mu, head.len_sd, head.emb_mu, head.emb_sd, head.blend, head.spread_ref)
    problems = []
    if w.ndim != 2 or w.shape[1] != vocab:
        problems.append(f"token_weights is {w.shape}, the tokenizer has {vocab} pieces")
    elif len(b) != w.shape[0]:
        problems.append(f"{len(b)} biases for {w.shape[0]} weight rows")
    if len(k) < 2 or np.any(np.diff(k) < 0):
        problems.append("knots are not increasing")
    if not (np.isfinite(w).all() and np.isfinite(b).all() and all(math.isfinite(v) for v in scalars)):
        problems.append("weights or scalars are not finite")
    elif min(head.len_sd, head.emb_sd, head.spread_ref) <= 0:
        problems.append("len_sd, emb_sd or spread_ref is not positive")
    if problems:
        raise ValueError(f"{path}: not a head for this router's tokenizer ({'; '.join(problems)}); {HEAD_FIX}")
    return head
