"""What the picker hashes: a prompt becomes chained block hashes, as vLLM keys its prefix cache.

vLLM hashes each full block of `block_size` token ids chained with its parent block's hash, so block i's
hash names the whole prefix up to it. The picker does the same, with a hash that every process agrees on
(BLAKE2b, 8 bytes, no per-process seed), so two router replicas and the simulator compute equal keys.

When the router has token ids (a tokenizer, a `/v1/completions` prompt of ids) it hashes those. When it
has only text, `approx_token_ids` splits the rendered prompt into words and punctuation (the regex the
engine simulator counts tokens with) and names each piece by its CRC-32: about 0.75 real tokens per
piece, consistent for the same text, which is all approximate affinity needs. `chat_token_ids` renders
chat messages the way the simulator does (`role content` per message, text parts joined), so the router's
keys equal the ids in the simulator's KV events; real vLLM's events carry real token ids, which match
only when the router tokenizes with the model's tokenizer and chat template (an upstream's `tokenizer`:
`oculis_router.model_tokens`, outside this stdlib-only core).
"""

from __future__ import annotations

import re
import zlib
from array import array
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from typing import Any

DEFAULT_BLOCK_SIZE = 16  # vLLM's default block size
ROOT = 0  # the parent of the first block (vLLM's NONE_HASH plays this part)
APPROX_TOKEN = re.compile(r"\w+|[^\w\s]")


def approx_token_ids(parts: Iterable[str]) -> list[int]:
    """Stable ids for the word/punctuation pieces of the text parts, in order."""
    crc = zlib.crc32
    return [crc(tok.encode()) for part in parts for tok in APPROX_TOKEN.findall(part)]


def chat_parts(messages: Sequence[Any]) -> list[str]:
    """`role content` per message; list content keeps its text parts, joined by spaces."""
    parts: list[str] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        role = msg.get("role", "") if isinstance(msg, dict) else ""
        parts.append(f"{role} {content or ''}")
    return parts


def chat_token_ids(messages: Sequence[Any]) -> list[int]:
    return approx_token_ids(chat_parts(messages))


def chain(parent: int, token_ids: Sequence[int]) -> int:
    """The hash of one block given its parent's hash and its token ids."""
    data = parent.to_bytes(8, "little") + array("q", token_ids).tobytes()
    return int.from_bytes(blake2b(data, digest_size=8).digest(), "little")


def adapter_root(adapter: str | None) -> int:
    """The parent of a request's first block: ROOT for the base model, a hash of the adapter's name for a
    LoRA adapter (vLLM keys an adapter's KV blocks apart from the base model's and other adapters')."""
    return ROOT if adapter is None else chain(ROOT, [zlib.crc32(adapter.encode())])


def block_hashes(token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE, parent: int = ROOT) -> tuple[int, ...]:
    """Chained hashes of the full blocks of `token_ids` (a partial last block is not cached by vLLM)."""
    if block_size < 1:
        raise ValueError(f"block_size: {block_size} must be at least 1")
    out: list[int] = []
    h = parent
    for i in range(len(token_ids) // block_size):
        h = chain(h, token_ids[i * block_size:(i + 1) * block_size])
        out.append(h)
    return tuple(out)
