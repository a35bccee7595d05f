"""A fast fake OpenAI-compatible upstream for overhead benchmarks: answers every POST at once with a
fixed chat completion. A raw asyncio protocol on uvloop with TCP_NODELAY and a deep listen backlog,
so that it is never the bottleneck (Nagle stalls and a tiny backlog are the classic traps).

    python bench/fake_upstream.py PORT
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys

BODY = json.dumps({
    "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": "fake",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13},
}).encode()
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + str(len(BODY)).encode()
            + b"\r\nconnection: keep-alive\r\n\r\n" + BODY)


class Fake(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport
        self.buf = b""
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = 0
            i = head.find(b"content-length:")
            if i >= 0:
                length = int(head[i + 15:].split(b"\r\n", 1)[0])
            total = head_end + 4 + length
            if len(self.buf) < total:
                return
            self.buf = self.buf[total:]
            self.t.write(RESPONSE)  # type: ignore[attr-defined]


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Fake, "127.0.0.1", port, backlog=4096, reuse_address=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1])))
