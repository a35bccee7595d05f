"""The simulator's stand-in tokenizer: a prompt token is a word or a punctuation mark, an answer token is
one placeholder word. No real vocabulary: ids are stable hashes into the model's vocabulary size, and an id
decodes to a placeholder word (so /detokenize round-trips the simulator's own answers, not real text)."""

from __future__ import annotations

import re
import zlib

from oculis_sim.scheduler import BLOCK

_LOREM = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et "
          "dolore magna aliqua enim ad minim veniam quis nostrud exercitation ullamco laboris nisi aliquip ex ea "
          "commodo consequat")
WORDS = tuple(_LOREM.split())
_TOKEN = re.compile(r"\w+|[^\w\s]")
TEMPLATE_TOKENS_PER_MESSAGE = 4  # role markers of a chat template (approximation; no real tokenizer here)


def token_count(text: str) -> int:
    return len(_TOKEN.findall(text))


def prompt_tokens(text_parts: list[str]) -> list[str]:
    out: list[str] = []
    for part in text_parts:
        out.extend(_TOKEN.findall(part))
    return out


def block_hashes(tokens: list[str], block: int = BLOCK) -> tuple[object | None, ...]:
    """Chained hashes of full blocks, as vLLM's prefix cache keys them."""
    out: list[object | None] = []
    h = 0
    for i in range(len(tokens) // block):
        h = hash((h, *tokens[i * block:(i + 1) * block]))
        out.append(h)
    return tuple(out)


def placeholder(n: int, start: int = 0) -> list[str]:
    return [WORDS[(start + i) % len(WORDS)] for i in range(n)]


def answer_tokens(n: int, start: int = 0, first: bool = True) -> list[str]:
    """The answer's tokens as strings: words, each after the first with its leading space."""
    words = placeholder(n, start)
    return [("" if first and i == 0 else " ") + w for i, w in enumerate(words)]


def token_id(token: str, vocab_size: int) -> int:
    """A placeholder word's id is its index (so it decodes back); any other token a stable hash."""
    word = token.strip()
    if word in WORDS:
        return WORDS.index(word)
    return len(WORDS) + zlib.crc32(word.encode()) % max(1, vocab_size - len(WORDS))


def decode(ids: list[int]) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in ids)
