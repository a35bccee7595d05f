"""A fault-injecting HTTP proxy in front of an OpenAI-compatible engine (the simulator, vLLM).

Per request, with probability `--rate`, one fault picked uniformly from the kinds, each a way real
upstreams fail:
  reset      the connection is reset (RST) before any answer
  e500       500 with an OpenAI error body
  e429       429 with `Retry-After: 1`
  hang       nothing is sent for `--hang-seconds` (past the router's timeouts), then the connection closes
  cut        the answer stops mid-way: a stream after a few events, a JSON body halfway through its length
  malformed  a non-streamed answer that is not JSON; a stream with an event whose data is not JSON
Everything else is relayed as it came. `GET /_faults` answers the counts so far, by kind and `none`.

    python bench/faultproxy.py --target http://127.0.0.1:8001 --port 9001 --rate 0.1 --seed 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import socket
import struct
from collections import Counter
from typing import Any

import aiohttp
from aiohttp import web

KINDS = ("reset", "e500", "e429", "hang", "cut", "malformed")
_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


def pick(rng: random.Random, rate: float, kinds: tuple[str, ...] = KINDS) -> str:
    """The fault for one request, or "none" (pure, so the mix is testable and seeded)."""
    return rng.choice(kinds) if rng.random() < rate else "none"


def _reset(request: web.Request) -> None:
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:  # linger 0: close() sends RST, as a crashed or overloaded peer does
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    return web.json_response(body, status=status, headers=headers)


class FaultProxy:
    def __init__(self, target: str, rate: float, seed: int, hang_seconds: float) -> None:
        self.target, self.rate, self.hang_seconds = target.rstrip("/"), rate, hang_seconds
        self.rng = random.Random(seed)
        self.counts: Counter[str] = Counter()
        self.session: aiohttp.ClientSession | None = None

    async def faults(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.counts))

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            doc = json.loads(raw) if raw else {}
            streaming = isinstance(doc, dict) and doc.get("stream") is True
        except ValueError:
            streaming = False
        kind = pick(self.rng, self.rate) if request.method == "POST" else "none"
        self.counts[kind] += 1
        if kind == "reset":
            _reset(request)
            return web.Response()  # never sent: the transport is gone
        if kind == "e500":
            return _error(500, "injected fault: internal error")
        if kind == "e429":
            return _error(429, "injected fault: overloaded", {"Retry-After": "1"})
        if kind == "hang":
            await asyncio.sleep(self.hang_seconds)
            _reset(request)
            return web.Response()
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self.session.request(request.method, self.target + request.path_qs, data=raw,
                                        headers=headers) as up:
            relay = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            if not streaming or up.status != 200:
                body = await up.read()
                if kind == "malformed" and up.status == 200:
                    return web.Response(body=body[: len(body) // 2] + b"}}}not json", status=200,
                                        content_type="application/json")
                if kind == "cut" and up.status == 200:
                    resp = web.StreamResponse(status=200, headers={**relay, "Content-Length": str(len(body))})
                    await resp.prepare(request)
                    await resp.write(body[: len(body) // 2])
                    _reset(request)
                    return resp
                return web.Response(body=body, status=up.status, headers=relay)
            resp = web.StreamResponse(status=200, headers=relay)
            await resp.prepare(request)
            events = 0
            cut_after = self.rng.randint(1, 3)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
                events += chunk.count(b"\n\n")
                if kind == "cut" and events >= cut_after:
                    _reset(request)
                    return resp
                if kind == "malformed" and events >= 1:
                    await resp.write(b'data: {"id": "chatcmpl-x", "choices": [{"delta": \n\n')
                    kind = "malformed-sent"
            await resp.write_eof()
            return resp


def build(target: str, rate: float, seed: int, hang_seconds: float) -> web.Application:
    proxy = FaultProxy(target, rate, seed, hang_seconds)

    async def session(app: web.Application) -> Any:
        proxy.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
        yield
        await proxy.session.close()

    app = web.Application(client_max_size=64 << 20)
    app.cleanup_ctx.append(session)
    app.router.add_get("/_faults", proxy.faults)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the engine's base, e.g. http://127.0.0.1:8001")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rate", type=float, default=0.1, help="share of requests that get a fault (default 0.1)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--hang-seconds", type=float, default=30, help="how long a hang lasts (past the router's timeouts)")
    args = p.parse_args()
    # A reset or cut makes aiohttp log the write that failed: expected here, so not logged.
    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)
    web.run_app(build(args.target, args.rate, args.seed, args.hang_seconds), host=args.host, port=args.port,
                print=None, access_log=None)


if __name__ == "__main__":
    main()
