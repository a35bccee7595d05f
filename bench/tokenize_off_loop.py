"""What tokenizing a long prompt for the prefix pickers costs the router's event loop, in one run: the
model's chat template and tokenizer (`oculis_router.model_tokens`, an upstream's `tokenizer:`) on the
loop, in a worker thread with `Tokenizer.encode` (which holds the GIL), and as the router does it
(`model_tokens.prompt_ids`: a worker thread with `encode_batch`, which lets go of the GIL). Meanwhile a
1 ms timer stands for the router's other requests: how late it fires is how long they wait.

    .venv/bin/python bench/tokenize_off_loop.py --tokenizer /work/tiny-model [--chars 32000] [--prompts 20]
Needs a model directory with tokenizer.json and a chat template (the real-engine tier's tiny model).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from oculis_router import model_tokens

Way = Callable[[model_tokens.ModelTokens, dict[str, Any]], Awaitable[list[int] | None]]


async def on_loop(mt: model_tokens.ModelTokens, body: dict[str, Any]) -> list[int] | None:
    return mt.ids(body, True)


async def thread_encode(mt: model_tokens.ModelTokens, body: dict[str, Any]) -> list[int] | None:
    return await asyncio.to_thread(mt.ids, body, True)  # encode: the GIL stays held while it runs


async def router(mt: model_tokens.ModelTokens, body: dict[str, Any]) -> list[int] | None:
    return await model_tokens.prompt_ids(mt, body, True)


async def measure(way: Way, mt: model_tokens.ModelTokens, body: dict[str, Any], prompts: int) -> dict[str, float]:
    late: list[float] = []

    async def timer() -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            late.append((time.perf_counter() - t - 0.001) * 1e3)

    task = asyncio.create_task(timer())
    await asyncio.sleep(0.02)
    late.clear()
    start = time.perf_counter()
    for _ in range(prompts):
        await way(mt, body)
        await asyncio.sleep(0.002)
    took = time.perf_counter() - start
    task.cancel()
    s = sorted(late)
    return {"ms_per_prompt": took / prompts * 1e3 - 2, "late_p50": statistics.median(s),
            "late_p90": s[int(len(s) * 0.9)], "late_max": s[-1]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="the model's directory (tokenizer.json, chat template)")
    ap.add_argument("--chars", type=int, default=32_000, help="characters of the system prompt")
    ap.add_argument("--prompts", type=int, default=20)
    args = ap.parse_args()
    try:
        mt = model_tokens.load(args.tokenizer)
    except ValueError as exc:
        raise SystemExit(f"--tokenizer: {exc}") from None
    text = "the system prompt says hello to the user and explains the tools it may call. "
    body = {"messages": [{"role": "system", "content": (text * (args.chars // len(text) + 1))[:args.chars]},
                         {"role": "user", "content": "What is 2 + 2?"}]}
    ids = mt.ids(body, True)
    assert ids is not None and asyncio.run(model_tokens.prompt_ids(mt, body, True)) == ids  # the same ids
    print(f"{len(ids)} tokens ({args.chars} characters), {args.prompts} prompts; a 1 ms timer's lateness in ms")
    print(f"{'way':<38}{'ms/prompt':>10}{'late p50':>10}{'late p90':>10}{'late max':>10}")
    ways: list[tuple[str, Way]] = [("on the loop (encode)", on_loop), ("worker thread, encode", thread_encode),
                                   ("worker thread, encode_batch (router)", router)]
    for name, way in ways:
        r = asyncio.run(measure(way, mt, body, args.prompts))
        print(f"{name:<38}{r['ms_per_prompt']:>10.1f}{r['late_p50']:>10.2f}{r['late_p90']:>10.2f}{r['late_max']:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
