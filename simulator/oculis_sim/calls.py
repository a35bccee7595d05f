"""One HTTP request on the simulator (Call) and its sequences (Choice): what each client has been sent, when
its sequences ran, and the bytes and logprobs of what it is sent next, in vLLM 0.32's shapes."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from aiohttp import web

from oculis_sim import logprobs as lp
from oculis_sim import openai_shapes as shapes
from oculis_sim.api_request import GenRequest, Prompt
from oculis_sim.scheduler import Request
from oculis_sim.tokens import answer_tokens


class Call:
    """One HTTP request: its client side and its n choices."""

    __slots__ = ("arrival", "chat", "choices", "created", "gen", "id", "model", "resp", "roles_sent", "seed",
                 "transport")

    def __init__(self, gen: GenRequest, model: str, resp: web.StreamResponse | None, arrival: float,
                 seed: tuple[int, ...]) -> None:
        self.gen = gen
        self.chat = gen.chat
        self.id = ("chatcmpl-" if gen.chat else "cmpl-") + (gen.request_id or uuid.uuid4().hex[:16])
        self.created = int(time.time())
        self.model = model
        self.resp = resp
        self.arrival = arrival
        self.seed = seed
        self.transport: asyncio.Transport | None = None
        self.choices: list[Choice] = []
        self.roles_sent = False

    def roles(self) -> bytes:
        """Chat streams open with a role chunk for every choice, at the first token of any (as vLLM)."""
        self.roles_sent = True
        return b"".join(shapes.event(shapes.chunk(True, self.id, self.created, self.model, ch.index, None, role=True))
                        for ch in self.choices)


class Choice:
    """One sequence of a call: what it has been sent and when it ran."""

    __slots__ = ("cached", "call", "done", "finish_reason", "head", "index", "max_output", "pos", "prompt", "req",
                 "scheduled", "tail", "word0")

    def __init__(self, call: Call, index: int, prompt: Prompt, max_output: int, finish_reason: str,
                 word0: int) -> None:
        self.call = call
        self.index = index
        self.prompt = prompt
        self.max_output = max_output
        self.finish_reason = finish_reason
        self.word0 = word0
        self.pos = 0
        self.cached = 0
        self.scheduled: float | None = None
        self.req: Request | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.head, self.tail = shapes.fast_parts(call.chat, call.id, call.created, call.model, index)

    def tokens(self, n: int) -> list[str]:
        return answer_tokens(n, self.word0 + self.pos, first=self.pos == 0)

    def logprobs(self, tokens: list[str], mean: float) -> Any:
        """This stretch of the answer's logprobs in the call's shape (None when not asked for)."""
        call = self.call
        top = call.gen.logprobs
        if top is None:
            return None
        items = lp.draw(tokens, mean, (*call.seed, self.index), max(top, 0) + 1, self.pos)
        if call.chat:
            return {"content": lp.chat_content(items, top)}
        start = len(self.prompt.text) if call.gen.echo else 0
        offset = start + sum(len(t) for t in answer_tokens(self.pos, self.word0))
        return lp.completion_logprobs(items, top, offset)
