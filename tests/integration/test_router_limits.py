"""Rate limits and budgets across replicas: two `oculis serve` processes sharing one real redis-server,
fake upstreams that report usage (10 prompt + 3 completion tokens per answer), clients over HTTP."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from fake_upstreams import free_port
from router_support import Fakes, RouterHandle, start_router
from skips import needs_command
from time_scale import Deadline

pytestmark = needs_command("redis-server", "redis-server")

# The classifier's tokenizer reads this as 10 pieces, as many as the fake upstreams bill: with
# max_tokens 3 a request reserves exactly what it will use (13), so the limits can be held to a request.
PROMPT = "please summarise the quarterly sales report for me"
PER_REQUEST = 13


def start_redis(port: int, where: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(where)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = Deadline(10)
    while not deadline.expired():
        ping = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        if ping.stdout.strip() == "PONG":
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")


@dataclass
class Redis:
    port: int
    where: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = start_redis(self.port, self.where)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    r = Redis(free_port(), tmp_path)
    r.start()
    yield r
    if r.proc is not None:
        r.proc.terminate()
        r.proc.wait(10)


@dataclass
class Replicas:
    urls: list[str]
    metrics_ports: list[int]
    logs: list[Path]
    config: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def metrics(self) -> str:
        return "\n".join(httpx.get(f"http://127.0.0.1:{p}/metrics").text for p in self.metrics_ports)

    def write(self, cfg: dict[str, Any]) -> None:
        self.config.write_text(yaml.safe_dump(cfg))


@pytest.fixture
def replicas(request: pytest.FixtureRequest, fakes: Fakes, redis: Redis, tmp_path: Path) -> Iterator[Replicas]:
    cfg: dict[str, Any] = request.param(fakes, redis)  # the config builder the test names
    path = tmp_path / "oculis-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    reps = Replicas([], [], [tmp_path / "a.log", tmp_path / "b.log"], path)
    try:
        for log in reps.logs:
            proc, url, mport = start_router(path, log)
            reps.procs.append(proc)
            reps.urls.append(url)
            reps.metrics_ports.append(mport)
        yield reps
    finally:
        for p in reps.procs:
            p.terminate()
            p.wait(10)


def limited(fakes: Fakes, redis: Redis, **route: Any) -> dict[str, Any]:
    cfg = fakes.config(**route)
    cfg["oculis"]["server"] = {"cache_backend": "redis", "redis_url": redis.url}
    return cfg


def tpm_config(fakes: Fakes, redis: Redis) -> dict[str, Any]:
    return limited(fakes, redis, limits={"tokens_per_minute": 2000, "per": "key"})


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: dict[str, Any] | None
    tokens: int  # usage the client was told (non-streamed: usage; streamed: the usage chunk)


async def ask(client: httpx.AsyncClient, url: str, key: str, stream: bool, model: str = "adaptive") -> Answer:
    body: dict[str, Any] = {"model": model, "max_tokens": 3, "messages": [{"role": "user", "content": PROMPT}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    headers = {"authorization": f"Bearer {key}"}
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        raw = await r.aread()
    hdrs = {k.lower(): v for k, v in r.headers.items()}
    if r.status_code != 200:
        return Answer(r.status_code, hdrs, json.loads(raw), 0)
    if not stream:
        data = json.loads(raw)
        return Answer(200, hdrs, data, data["usage"]["total_tokens"])
    tokens = 0
    for line in raw.decode().splitlines():
        if line.startswith("data: {"):
            usage = json.loads(line[6:]).get("usage")
            if usage:
                tokens = usage["total_tokens"]
    return Answer(200, hdrs, None, tokens)


async def flood(urls: list[str], key: str, n: int, concurrency: int, stream_every: int = 2,
                model: str = "adaptive") -> list[Answer]:
    """`n` requests from one key, `concurrency` at a time, alternating replicas; every
    `stream_every`-th streamed."""
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency * 2)) as client:
        async def one(i: int) -> Answer:
            async with sem:
                return await ask(client, urls[i % len(urls)], key, stream_every > 0 and i % stream_every == 1, model)
        return await asyncio.gather(*(one(i) for i in range(n)))


def assert_clean_429(a: Answer, code: str = "rate_limit_exceeded") -> None:
    assert a.status == 429, a
    assert a.body is not None and a.body["error"]["code"] == code, a.body
    assert a.body["error"]["message"]
    assert int(a.headers["retry-after"]) >= 1


@pytest.mark.parametrize("replicas", [tpm_config], indirect=True)
def test_a_token_limit_holds_across_replicas_for_streamed_and_whole_answers(replicas: Replicas) -> None:
    answers = asyncio.run(flood(replicas.urls, "sk-flood", 400, 40))
    served = [a for a in answers if a.status == 200]
    refused = [a for a in answers if a.status != 200]
    tokens = sum(a.tokens for a in served)
    # The whole run is far shorter than the window: what was served is what one minute allows.
    print(f"served {tokens} tokens in {len(served)} answers of {len(answers)} against tokens_per_minute 2000")
    assert 0.80 * 2000 <= tokens <= 1.05 * 2000, (tokens, len(served))
    assert all(a.tokens == PER_REQUEST for a in served)  # streams told their usage, so they were counted
    streamed_served = sum(1 for i, a in enumerate(answers) if a.status == 200 and i % 2 == 1)
    assert streamed_served > 0 and len(served) - streamed_served > 0
    for a in refused:
        assert_clean_429(a)
        assert "tokens_per_minute is 2000 per key" in a.body["error"]["message"]  # type: ignore[index]
        assert a.headers["x-ratelimit-limit-tokens"] == "2000"
        assert int(a.headers["x-ratelimit-remaining-tokens"]) < PER_REQUEST
    for a in served:
        assert a.headers["x-ratelimit-limit-tokens"] == "2000"
        assert 0 <= int(a.headers["x-ratelimit-remaining-tokens"]) <= 2000 - PER_REQUEST
        assert re.fullmatch(r"(\d+m)?[\d.]+m?s", a.headers["x-ratelimit-reset-tokens"])
    # both replicas served and refused: one count, not one per replica
    text = replicas.metrics()
    assert text.count('oculis_rate_limited_total{kind="tokens_per_minute",route="adaptive"}') == 2
    # another key has its own count: not touched by the flood
    other = asyncio.run(flood(replicas.urls, "sk-other", 4, 2))
    assert [a.status for a in other] == [200] * 4


def budget_config(fakes: Fakes, redis: Redis) -> dict[str, Any]:
    cfg = limited(fakes, redis)
    # A dear upstream (a dollar per thousand tokens) so a few dozen requests spend the budget.
    dear = {"name": "dear", "provider": "vllm", "base_url": fakes.servers["small"].url + "/v1", "model": "m",
            "pricing": {"input_per_mtok": 1000, "output_per_mtok": 1000}}
    cfg["oculis"]["upstreams"].append(dear)
    cfg["oculis"]["routes"].append({"name": "metered", "tiers": [{"name": "only", "upstream": "dear"}],
                                    "budget": {"dollars": 0.5, "period": "day", "per": "key"}})
    return cfg


@pytest.mark.parametrize("replicas", [budget_config], indirect=True)
def test_a_dollar_budget_stops_spending_within_one_request_of_its_amount(replicas: Replicas) -> None:
    cost = PER_REQUEST * 1000 / 1e6  # what each answer costs, by the metrics' cost math
    answers = asyncio.run(flood(replicas.urls, "sk-spender", 80, 20, model="metered"))
    # then one at a time, nothing in flight: the budget refuses only when less than a request is left
    answers += asyncio.run(flood(replicas.urls, "sk-spender", 4, 1, model="metered"))
    spent = sum(float(m) for m in re.findall(r'oculis_cost_dollars_total\{upstream="dear"\} ([\d.e-]+)',
                                             replicas.metrics()))
    served = sum(1 for a in answers if a.status == 200)
    assert spent == pytest.approx(served * cost)
    print(f"spent ${spent:.4f} of a $0.50 budget in {served} answers (${cost:.3f} each)")
    assert 0.5 - cost < spent <= 0.5 + 1e-9, (spent, served)
    refused = [a for a in answers if a.status != 200]
    assert refused and all(a.status == 429 for a in refused)
    for a in refused:
        assert_clean_429(a, "insufficient_quota")
        assert a.headers["x-should-retry"] == "false"
        assert "$0.50 per day per key" in a.body["error"]["message"]  # type: ignore[index]
    assert answers[-1].status == 429
    assert 'oculis_budget_remaining_dollars{scope="metered",subject="k-' in replicas.metrics()


def restart_config(fakes: Fakes, redis: Redis) -> dict[str, Any]:
    return limited(fakes, redis, limits={"requests_per_minute": 100000, "tokens_per_minute": 10_000_000})


@pytest.mark.parametrize("replicas", [restart_config], indirect=True)
def test_redis_restarted_mid_run_loses_no_request(replicas: Replicas, redis: Redis) -> None:
    async def run() -> list[Answer]:
        out: list[Answer] = []
        out += await flood(replicas.urls, "sk-steady", 60, 10)
        redis.kill()
        out += await flood(replicas.urls, "sk-steady", 60, 10)  # down: on_backend_error allow (the default)
        await asyncio.to_thread(redis.start)
        out += await flood(replicas.urls, "sk-steady", 60, 10)
        return out

    answers = asyncio.run(run())
    assert len(answers) == 180
    assert all(a.status == 200 and a.tokens == PER_REQUEST for a in answers), [a.status for a in answers]
    text = replicas.metrics()
    assert "oculis_limiter_backend_errors_total" in text and 'op="reserve"' in text
    assert "error_500" not in text
    # counting again once Redis is back (the scripts reloaded into the new, empty server)
    def counted_again() -> bool:
        assert all(a.status == 200 for a in asyncio.run(flood(replicas.urls, "sk-steady", 2, 2)))
        return bool(subprocess.run(["redis-cli", "-p", str(redis.port), "--scan", "--pattern", "oculis:rl:*"],
                                   capture_output=True, text=True).stdout.split())

    eventually(counted_again, timeout=30, what="requests counted in the restarted Redis")
    logs = [p.read_text() for p in replicas.logs]
    for log in logs:  # one warning per interval, not one per request
        assert 1 <= log.count("rate limiter store (redis) failed") <= 3, log[-2000:]
        assert "Traceback" not in log

    # `deny` refuses cleanly while Redis is down
    before = [httpx.get(u + "/readyz").json()["config"] for u in replicas.urls]
    cfg = yaml.safe_load(replicas.config.read_text())
    cfg["oculis"]["server"]["limiter"] = {"on_backend_error": "deny"}
    replicas.write(cfg)
    eventually(lambda: all(httpx.get(u + "/readyz").json()["config"] != b for u, b in zip(replicas.urls, before,
                                                                                         strict=True)),
               timeout=30, what="both replicas on the new config")
    redis.kill()
    denied = asyncio.run(flood(replicas.urls, "sk-steady", 20, 5))
    for a in denied:
        assert_clean_429(a)
        assert "on_backend_error is deny" in a.body["error"]["message"]  # type: ignore[index]
    assert 'oculis_rate_limited_total{kind="backend_error",route="adaptive"}' in replicas.metrics()


# In-process router (memory backend): what counts and what does not.

def tokens_counted(router: RouterHandle) -> float:
    limiter = router.app.state.holder.current.limiter
    assert limiter is not None
    return sum(sum(slices.values()) for key, (_, slices) in limiter.backend._data.items()
               if ":tokens_per_minute:" in key)


def post(router: RouterHandle, body: dict[str, Any], key: str = "sk-one") -> httpx.Response:
    return httpx.post(router.server.url + "/v1/chat/completions", json=body,
                      headers={"authorization": f"Bearer {key}"}, timeout=30)


def test_a_cache_hit_counts_as_a_request_but_spends_no_tokens(router: RouterHandle, fakes: Fakes) -> None:
    router.write(fakes.config(limits={"tokens_per_minute": 100, "requests_per_minute": 50}))
    eventually(lambda: router.app.state.holder.current.limiter is not None, timeout=10, what="limits applied")
    body = {"model": "adaptive", "max_tokens": 3, "temperature": 0, "messages": [{"role": "user", "content": PROMPT}]}
    first = post(router, body)
    assert first.headers["x-oculis-cache"] == "miss" and first.headers["x-ratelimit-remaining-requests"] == "49"
    eventually(lambda: tokens_counted(router) == PER_REQUEST, timeout=5, what="the miss settled at its usage")
    hits = [post(router, body) for _ in range(5)]
    assert all(h.headers["x-oculis-cache"] == "hit" for h in hits)
    assert [h.headers["x-ratelimit-remaining-requests"] for h in hits] == ["48", "47", "46", "45", "44"]
    eventually(lambda: tokens_counted(router) == PER_REQUEST, timeout=5, what="hits settled at nothing")


def test_calls_naming_an_upstream_take_the_server_limits(router: RouterHandle, fakes: Fakes) -> None:
    cfg = fakes.config()
    cfg["oculis"]["server"] = {"limits": {"requests_per_minute": 2}}
    router.write(cfg)
    eventually(lambda: router.app.state.holder.current.limiter is not None, timeout=10, what="limits applied")
    body = {"model": "llama-8b", "messages": [{"role": "user", "content": PROMPT}]}
    answers = [post(router, body) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["error"]["code"] == "rate_limit_exceeded"
    assert "this router (server defaults)" in answers[2].json()["error"]["message"]
    assert post(router, body, key="sk-two").status_code == 200  # per key (the default): another key has its own


def test_a_stream_the_client_cuts_settles_what_it_relayed_not_its_reservation(router: RouterHandle,
                                                                              fakes: Fakes) -> None:
    router.write(fakes.config(limits={"tokens_per_minute": 100_000}))
    eventually(lambda: router.app.state.holder.current.limiter is not None, timeout=10, what="limits applied")
    for script in fakes.scripts.values():
        script.stream_delay = 0.3
    body = {"model": "adaptive", "max_tokens": 5000, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}
    with httpx.stream("POST", router.server.url + "/v1/chat/completions", json=body,
                      headers={"authorization": "Bearer sk-cut"}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content"' in line:
                break  # the client leaves after the first words
    # had it kept its reservation, the count would hold 10 + 5000
    settled = eventually(lambda: (n := tokens_counted(router)) < 5000 and n, timeout=10,
                         what="the cut stream settled")
    assert 10 < settled <= 10 + 5  # its prompt and the few events it relayed
