"""What a client sees of the tokens an engine emits: TTFT, the gaps between chunks, E2E, TPOT.

One recorder for `sim replay` and `sim fleet` (the same figures `vllm bench serve` reports): a token
emitted at the end of a step reaches the client `per_token_s` x its position later (the API server
streams the outputs one after another), the last one `finish_s` before the request is done.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Generic, TypeVar

from oculis_sim.scheduler import Request


class Rec:
    """One request as the client sees it: when it was sent, its first and latest token."""

    __slots__ = ("first", "last", "send")

    def __init__(self, send: float) -> None:
        self.send = send
        self.first = -1.0
        self.last = -1.0


R = TypeVar("R", bound=Rec)


class TokenRecorder(Generic[R]):
    """Per-request records (index = the request id the engine carries) and the pooled samples, in seconds.

    `itl_w` weights each gap: 1 for a gap of one request, the batch size for a decode run's shared gap."""

    def __init__(self, n: int, per_token_s: float, finish_s: float) -> None:
        self.recs: list[R | None] = [None] * n
        self.lag = per_token_s
        self.finish = finish_s
        self.ttft = array("d")
        self.itl = array("d")
        self.itl_w = array("d")
        self.e2e = array("d")
        self.tpot = array("d")
        self.out_tokens = 0
        self.last_done = 0.0

    def rec(self, rid: int) -> R:
        rec = self.recs[rid]
        assert rec is not None
        return rec

    def emitted(self, t: float, emitted: Iterable[tuple[Request, int]]) -> list[R]:
        """Tokens emitted by a step ending at t; returns the records that got their first token."""
        lag = self.lag
        firsts: list[R] = []
        for req, k in emitted:
            rec = self.rec(req.rid)
            vis = t + lag * req.num_output
            if rec.first < 0:
                rec.first = vis
                self.ttft.append(vis - rec.send)
                firsts.append(rec)
            else:
                self.itl.append(vis - rec.last)
                self.itl_w.append(1.0)
            rec.last = vis
            self.out_tokens += k
        return firsts

    def decode_run(self, durations: Iterable[float], batch: int, end: float, reqs: Iterable[Request]) -> None:
        """j pure-decode steps of `batch` requests ending at `end`: one shared gap per step."""
        lag = self.lag
        gaps = array("d", (d + lag for d in durations))
        self.itl.extend(gaps)
        self.itl_w.extend(array("d", [float(batch)]) * len(gaps))
        for req in reqs:
            self.rec(req.rid).last = end + lag * req.num_output
        self.out_tokens += len(gaps) * batch

    def finished(self, req: Request) -> R:
        rec = self.rec(req.rid)
        done = rec.last + self.finish
        self.e2e.append(done - rec.send)
        if req.num_output > 1:
            self.tpot.append((rec.last - rec.first) / (req.num_output - 1))
        self.last_done = max(self.last_done, done)
        return rec
