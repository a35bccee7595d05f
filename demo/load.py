"""Load for the demo's canary step: long prompts to every pod behind the given Service hosts in the
stand-in's endpoint map (the stable and the canary Service, so both tracks are measured), a few at a
time each, until killed. Each prompt starts with a fresh word, so no prefix-cache hit hides the
prefill the canary's change slows down.

    DEMO_ENGINE_KEY=KEY python demo/load.py ENDPOINTS_JSON MODEL HOST [HOST ...]

DEMO_ENGINE_KEY: the engines' API key (the Secret oculis-engine-keys), in the environment, never in argv.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import sys
import time
import uuid
from pathlib import Path

import httpx


def ports(endpoints: Path, hosts: list[str]) -> list[int]:
    try:
        known = json.loads(endpoints.read_text())
    except (OSError, ValueError):  # the stand-in rewrites the file: read it again next round
        return []
    return [int(p["port"]) for h in hosts for p in known.get(h, {}).get("pods", [])]


def one(port: int, model: str) -> None:
    key = os.environ.get("DEMO_ENGINE_KEY")
    with contextlib.suppress(httpx.HTTPError):  # a pod going away mid-request: the next round skips it
        httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                   headers={"authorization": f"Bearer {key}"} if key else {}, json={
            "model": model, "prompt": f"{uuid.uuid4()} " + "word " * 1500, "max_tokens": 16})


def main() -> None:
    endpoints, model, hosts = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        while True:
            found = ports(endpoints, hosts)
            list(pool.map(lambda p: one(p, model), found * 3))
            if not found:
                time.sleep(0.5)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
