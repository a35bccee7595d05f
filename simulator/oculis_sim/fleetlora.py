"""LoRA slots of one engine in `oculis sim fleet`'s virtual time: the model `sim serve` runs in asyncio
(`lora.py`), as plain bookkeeping. At most `max_loras` distinct adapters run at once; a request for another
waits until a slot frees (every running request of some adapter finished), and one whose adapter is not in
a GPU slot pays `lora.LOAD_S` to load it (slots keep their adapters; the least recently used one no
request runs is evicted). Waiting
requests are admitted in arrival order, skipping one that still cannot run (vLLM's scheduler skips a
request whose adapter does not fit and schedules the next)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from oculis_sim.lora import LOAD_S, into_slot


def draw(n: int, count: int, skew: float, seed: int) -> list[str | None]:
    """The adapter each of n requests asks for: `adapter-k` of `count`, k drawn with weight 1/(k+1)^skew."""
    weights = 1.0 / np.arange(1, count + 1) ** skew
    picks = np.random.default_rng(seed).choice(count, size=n, p=weights / weights.sum())
    return [f"adapter-{k}" for k in picks]


class Slots:
    def __init__(self, max_loras: int) -> None:
        self.max_loras = max(1, max_loras)
        self.running: Counter[str] = Counter()  # adapter -> requests admitted and not finished
        self.waiting: list[tuple[str, Any]] = []  # (adapter, what to admit), in arrival order
        self.resident: list[str] = []  # adapters in GPU slots, least recently used first
        self.loads = 0  # adapters loaded into a slot (each costs LOAD_S)
        self.waits = 0  # requests that had to wait for a slot

    def _fits(self, adapter: str) -> bool:
        return adapter in self.running or len(self.running) < self.max_loras

    def _take(self, adapter: str) -> float:
        loaded = into_slot(self.resident, adapter, self.max_loras, self.running)
        self.running[adapter] += 1
        self.loads += loaded
        return LOAD_S if loaded else 0.0

    def admit(self, adapter: str, item: Any) -> float | None:
        """The load delay when the request for `adapter` runs now (0.0: its adapter is in a slot); None when
        it waits for a slot (`release` hands it back)."""
        if self._fits(adapter):
            return self._take(adapter)
        self.waiting.append((adapter, item))
        self.waits += 1
        return None

    def release(self, adapter: str) -> list[tuple[Any, float]]:
        """A request for `adapter` finished: the waiting requests that now run, each with its load delay."""
        self.running[adapter] -= 1
        if self.running[adapter] <= 0:
            del self.running[adapter]
        out: list[tuple[Any, float]] = []
        left: list[tuple[str, Any]] = []
        for a, item in self.waiting:
            if self._fits(a):
                out.append((item, self._take(a)))
            else:
                left.append((a, item))
        self.waiting = left
        return out

    def state(self) -> tuple[frozenset[str], frozenset[str]]:
        """(running, waiting) adapters, as vllm:lora_requests_info shows them."""
        return frozenset(self.running), frozenset(a for a, _ in self.waiting)
