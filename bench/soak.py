"""Router soak under faults: nothing lost, nothing hung, nothing leaked.

Two `oculis serve` replicas share a real redis-server (cache and rate-limit counts) and sit in front
of two engine simulators (`oculis sim serve`), each behind bench/faultproxy.py injecting faults into
`--fault-rate` (10 %) of the calls: resets, 500s, 429 + Retry-After, hangs past the timeouts,
streams cut mid-way, malformed JSON and SSE. A local load generator sends a steady rate plus bursts
(chat and completions, streamed and not, some cacheable) to the replicas in rotation, each request
with a deadline. Meanwhile: the config is hot-reloaded every `--reload-every` s (the second reload a
broken file, fixed by the next), Redis is restarted, and one replica is taken out of rotation,
SIGTERMed and restarted (a rolling restart).

It prints a table and exits 1 unless: every request got a complete answer or an OpenAI-shaped error
within its deadline (0 lost, 0 hung, 0 5xx without a cause); every stream ended with [DONE] or an
error event; no traceback in any log; the kept replica's RSS and its open fds other than pooled
connections grew < 10 % after warm-up, and its pooled connections to each upstream and to Redis never
outnumbered twice the requests it held at once (a pool follows the load; a leak outgrows it);
no secret in any log line; the routers' oculis_requests_total equals the responses the load
generator saw.

    .venv/bin/python bench/soak.py --duration 600
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

HERE = Path(__file__).resolve().parent
PY = sys.executable
CLIENT_KEY = "sk-soak-client-SECRET-7f3a"  # what the load generator sends; must appear in no log
UPSTREAM_KEY = "sk-soak-upstream-SECRET-91c2"  # what the routers send the engines; must appear in no log
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SIMPLE = ["hi", "what is 2+2?", "say hello", "name a colour", "capital of France?", "spell cat", "thanks!",
          "is water wet?", "count to three", "translate 'yes' to French"]
COMPLEX = ["Prove that there are infinitely many primes and discuss the history of the argument in detail.",
           "Design a distributed consensus protocol tolerant to Byzantine faults; analyse its message complexity.",
           "Derive the backpropagation equations for a transformer layer, including layer norm and attention.",
           "Compare the economic consequences of the 1929 and 2008 financial crises with citations.",
           "Write a formal specification in TLA+ of a two-phase commit and argue its safety invariants."]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the pure part: what one answer was --------------------------------------------------------------

def _error_of(doc: Any) -> dict[str, Any] | None:
    if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
        err: dict[str, Any] = doc["error"]
        if isinstance(err.get("message"), str) and err["message"] and isinstance(err.get("type"), str):
            return err
    return None


def classify(status: int, body: bytes, streamed: bool) -> str:
    """One answer as the client saw it: `ok`, `error <status> <code>` (an OpenAI-shaped refusal),
    `stream-error <code>` (a stream that ended with an error event), `5xx-no-cause <status>` or
    `lost <why>` (anything a client could not make sense of)."""
    if status != 200:
        try:
            err = _error_of(json.loads(body))
        except ValueError:
            err = None
        if err is None:
            return f"lost {status}-not-openai-shaped"
        if status >= 500 and err.get("code") in (None, "internal"):
            return f"5xx-no-cause {status}"
        return f"error {status} {err.get('code')}"
    if not streamed:
        try:
            doc = json.loads(body)
        except ValueError:
            return "lost bad-json"
        ok = isinstance(doc, dict) and isinstance(doc.get("choices"), list) and doc["choices"]
        return "ok" if ok else "lost no-choices"
    events = [e[len("data:"):].strip() for e in body.decode("utf-8", "replace").split("\n\n")
              if e.strip().startswith("data:")]
    if not events:
        return "lost empty-stream"
    datas = events[:-1] if events[-1] == "[DONE]" else events
    parsed = []
    for d in datas:
        try:
            parsed.append(json.loads(d))
        except ValueError:
            return "lost malformed-event"
    if parsed and (err := _error_of(parsed[-1])) is not None:
        return f"stream-error {err.get('code')}"
    if events[-1] != "[DONE]":
        return "lost truncated-stream"
    return "ok"


def clean_exit(code: int | None, log: Path) -> bool:
    """A graceful stop: uvicorn finished its shutdown, then exited 0 or re-raised the SIGTERM it caught
    (uvicorn does, so the exit status says which signal ended it)."""
    return code in (0, -signal.SIGTERM) and "Finished server process" in log.read_text(errors="replace")[-300:]


def growth(start: float, end: float) -> float:
    return (end - start) / start if start else 0.0


# ---- the processes -----------------------------------------------------------------------------------

@dataclass
class Proc:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = open(self.log, "ab")  # noqa: SIM115  # appended: a restart keeps the earlier lines
        self.popen = subprocess.Popen(self.argv, stdout=out, stderr=out, env={**os.environ, **self.env},
                                      start_new_session=True)

    def stop(self, sig: int = signal.SIGTERM, wait: float = 60) -> int | None:
        if self.popen is None or self.popen.poll() is not None:
            return self.popen.returncode if self.popen else None
        self.popen.send_signal(sig)
        try:
            return self.popen.wait(wait)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            return self.popen.wait(10)

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid


def wait_http(url: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {seconds:g} s")


def wait_redis(port: int, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        if out.stdout.strip() == "PONG":
            return
        time.sleep(0.05)
    raise RuntimeError(f"redis on {port} did not come up")


def router_config(proxies: list[int], redis_port: int, generation: int) -> dict[str, Any]:
    """The config both replicas serve; `generation` changes what a reload changes (cache TTL)."""
    timeouts = {"connect_seconds": 1, "first_byte_seconds": 3, "idle_seconds": 2}
    ups = [{"name": name, "provider": "vllm", "base_url": f"http://127.0.0.1:{port}/v1", "model": MODEL,
            "api_key_env": "SOAK_UPSTREAM_KEY", "timeouts": timeouts,
            "pricing": {"input_per_mtok": 0.1 * (i + 1), "output_per_mtok": 0.2 * (i + 1)}}
           for i, (name, port) in enumerate(zip(("small", "large"), proxies, strict=True))]
    route = {"name": "soak", "strategy": "semantic", "tiers": [
        {"name": "simple", "match": {"complexity_below": 0.5}, "upstream": "small"},
        {"name": "complex", "match": {}, "upstream": "large"}],
        "escalation": {"enabled": True, "on_upstream_error": True, "max_retries": 2},
        "cache": {"enabled": True, "ttl_seconds": 60 + generation, "key": ["model", "messages", "temperature"],
                  "max_entries": 10_000, "only_when": {"temperature_below": 0.01}}}
    return {"oculis": {"upstreams": ups, "routes": [route], "server": {
        "cache_backend": "redis", "redis_url": f"redis://127.0.0.1:{redis_port}/0",
        "client_keys_env": "SOAK_CLIENT_KEYS",
        "limits": {"requests_per_minute": 1_000_000, "tokens_per_minute": 1_000_000_000}}}}


@dataclass
class Replica:
    proc: Proc
    port: int
    metrics_port: int
    in_flight: int = 0
    peak_in_flight: int = 0
    counted_before_restart: float = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def requests_total(metrics_port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("oculis_requests_total{"))


def usage_of(pid: int) -> tuple[int, int]:
    """(RSS in KiB, open file descriptors) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def sockets_of(pid: int, names: dict[int, str]) -> Counter[str]:
    """A process's open fds by what they are: TCP sockets by the named port at either end and state
    (from /proc/net/tcp), other fds by kind: what to look at when the count grows."""
    tcp: dict[str, str] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote, state, inode = int(f[1].split(":")[1], 16), int(f[2].split(":")[1], 16), f[3], f[9]
        peer = names.get(remote) or names.get(local) or "other"
        tcp[inode] = f"tcp {peer} {'ESTABLISHED' if state == '01' else 'LISTEN' if state == '0A' else state}"
    out: Counter[str] = Counter()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out[tcp.get(target[len("socket:["):-1], "socket (not tcp4)")] += 1
        else:  # anon_inode:[eventpoll], pipe:[...], /dev/null, a file
            out[target.split(":")[0] if ":" in target else "file " + target] += 1
    return out


# ---- the load ---------------------------------------------------------------------------------------

@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    responses: int = 0  # requests that got an HTTP status line (each one a router counted)
    examples: dict[str, str] = field(default_factory=dict)


def one_request(rng: random.Random) -> tuple[str, dict[str, Any]]:
    prompt = rng.choice(SIMPLE if rng.random() < 0.6 else COMPLEX)
    stream = rng.random() < 0.5
    body: dict[str, Any] = {"model": "soak", "max_tokens": rng.randint(4, 24), "stream": stream,
                            "temperature": 0 if rng.random() < 0.3 else 0.7}
    if rng.random() < 0.8:
        body["messages"] = [{"role": "user", "content": prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = prompt
    return "/v1/completions", body


async def send(client: httpx.AsyncClient, replica: Replica, path: str, body: dict[str, Any], deadline: float,
               tally: Tally) -> None:
    t0 = time.monotonic()
    replica.in_flight += 1
    replica.peak_in_flight = max(replica.peak_in_flight, replica.in_flight)
    try:
        async with asyncio.timeout(deadline):
            async with client.stream("POST", replica.url + path, json=body,
                                     headers={"authorization": f"Bearer {CLIENT_KEY}"}) as resp:
                tally.responses += 1
                data = await resp.aread()
                outcome = classify(resp.status_code, data, bool(body.get("stream")) and resp.status_code == 200)
                if outcome.startswith(("lost", "5xx")):
                    tally.examples.setdefault(outcome, data[-400:].decode("utf-8", "replace"))
    except TimeoutError:
        outcome = "hung"
    except httpx.HTTPError as exc:
        outcome = f"lost {type(exc).__name__}"
        tally.examples.setdefault(outcome, repr(exc)[:300])
    finally:
        replica.in_flight -= 1
    tally.outcomes[outcome] += 1
    tally.latencies.append(time.monotonic() - t0)


async def load(rotation: list[Replica], clients: dict[int, httpx.AsyncClient], tally: Tally, duration: float,
               rate: float, burst: int, burst_every: float, deadline: float, seed: int) -> None:
    rng = random.Random(seed)
    tasks: set[asyncio.Task[None]] = set()
    start = time.monotonic()
    next_burst = start + burst_every / 2
    i = 0
    while (now := time.monotonic()) < start + duration:
        n = 1
        if now >= next_burst:
            n, next_burst = burst, next_burst + burst_every
        for _ in range(n):
            replica = rotation[i % len(rotation)]
            i += 1
            path, body = one_request(rng)
            t = asyncio.create_task(send(clients[replica.port], replica, path, body, deadline, tally))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.sleep(rng.expovariate(rate))
    if tasks:
        await asyncio.wait(tasks)


# ---- the run ----------------------------------------------------------------------------------------

class Soak:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.redis_port = free_port()
        self.procs: list[Proc] = []
        self.events: list[str] = []
        self.samples: list[tuple[float, int, int]] = []
        self.generation = 0

    def note(self, what: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {what}"
        self.events.append(line)
        print(line, flush=True)

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        p = Proc(name, argv, self.work / f"{name}.log", env or {})
        p.start()
        self.procs.append(p)
        return p

    def start_redis(self) -> Proc:
        p = self.spawn("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(self.work)])
        wait_redis(self.redis_port)
        return p

    def write_config(self, broken: bool = False) -> None:
        path = self.work / "oculis-config.yaml"
        tmp = path.with_suffix(".tmp")
        if broken:
            tmp.write_text("oculis:\n  upstreams: [{name: small, provider: vllm\n")  # unclosed: a bad edit
        else:
            self.generation += 1
            tmp.write_text(yaml.safe_dump(router_config(self.proxy_ports, self.redis_port, self.generation)))
        tmp.replace(path)  # atomic, as a ConfigMap update is

    def router(self, name: str, port: int, mport: int) -> Proc:
        config = str(self.work / "oculis-config.yaml")
        return self.spawn(name, [PY, "-m", "oculis_cli.main", "serve", "--config", config, "--port", str(port),
                                 "--metrics-port", str(mport), "--shutdown-grace", "60"],
                          {"SOAK_CLIENT_KEYS": CLIENT_KEY, "SOAK_UPSTREAM_KEY": UPSTREAM_KEY})

    def setup(self) -> None:
        self.t0 = time.monotonic()
        self.redis = self.start_redis()
        self.proxy_ports = []
        for i in range(2):
            sim_port, proxy_port = free_port(), free_port()
            self.spawn(f"sim{i}", [PY, "-m", "oculis_sim.cli", "serve", "--model", MODEL, "--gpu", "H100-80GB",
                                   "--port", str(sim_port), "--seed", str(i)])
            self.spawn(f"proxy{i}", [PY, str(HERE / "faultproxy.py"), "--target", f"http://127.0.0.1:{sim_port}",
                                     "--port", str(proxy_port), "--rate", str(self.args.fault_rate),
                                     "--seed", str(self.args.seed + i), "--hang-seconds", "8"])
            wait_http(f"http://127.0.0.1:{sim_port}/health")
            wait_http(f"http://127.0.0.1:{proxy_port}/_faults")
            self.proxy_ports.append(proxy_port)
        self.write_config()
        self.replicas = []
        for i in range(2):
            port, mport = free_port(), free_port()
            self.replicas.append(Replica(self.router(f"router{i}", port, mport), port, mport))
        for r in self.replicas:
            wait_http(r.url + "/readyz")
        self.note("up: redis, 2 simulators behind fault proxies, 2 routers")

    async def chaos(self, rotation: list[Replica]) -> None:
        d = self.args.duration
        start = time.monotonic()
        plan = [(0.4 * d, "redis"), (0.6 * d, "restart")]
        t = self.args.reload_every
        while t < d:
            plan.append((t, "reload"))
            t += self.args.reload_every
        plan.sort()
        reloads = 0
        for at, what in plan:
            await asyncio.sleep(max(0.0, start + at - time.monotonic()))
            if what == "reload":
                reloads += 1
                self.write_config(broken=reloads == 2)
                self.note("config reloaded" + (" with a broken file" if reloads == 2 else ""))
            elif what == "redis":
                self.redis.stop()
                self.note("redis stopped")
                await asyncio.sleep(2)
                self.redis = await asyncio.to_thread(self.start_redis)
                self.note("redis restarted")
            else:
                await self.rolling_restart(rotation, self.replicas[1])

    async def rolling_restart(self, rotation: list[Replica], r: Replica) -> None:
        rotation.remove(r)  # as a Service drops a terminating pod's endpoint
        self.note(f"{r.proc.name} out of rotation ({r.in_flight} in flight)")
        limit = time.monotonic() + 60
        while r.in_flight and time.monotonic() < limit:
            await asyncio.sleep(0.05)
        r.counted_before_restart += await asyncio.to_thread(requests_total, r.metrics_port)
        code = await asyncio.to_thread(r.proc.stop, signal.SIGTERM, 90)
        self.note(f"{r.proc.name} SIGTERMed, exit {code}")
        if not clean_exit(code, r.proc.log):
            self.failures.append(f"{r.proc.name} exited {code} on SIGTERM without a graceful shutdown")
        r.proc.start()
        await asyncio.to_thread(wait_http, r.url + "/readyz")
        rotation.append(r)
        self.note(f"{r.proc.name} restarted and back in rotation")

    def port_names(self) -> dict[int, str]:
        return {self.redis_port: "redis", **{p: f"proxy{i}" for i, p in enumerate(self.proxy_ports)},
                **{r.port: r.proc.name for r in self.replicas}, **{r.metrics_port: "metrics" for r in self.replicas}}

    async def sample(self, stop: asyncio.Event) -> None:
        kept = self.replicas[0].proc.pid
        # connections that follow the load: to the upstreams, to Redis, and the clients' kept-alive ones
        pooled_peers = {"redis", self.replicas[0].proc.name, *(f"proxy{i}" for i in range(len(self.proxy_ports)))}
        while not stop.is_set():
            rss, _ = usage_of(kept)
            fds = await asyncio.to_thread(sockets_of, kept, self.port_names())
            pooled = Counter({k.split()[1]: n for k, n in fds.items()
                              if k.endswith(" ESTABLISHED") and k.split()[1] in pooled_peers})
            self.samples.append((time.monotonic() - self.load_start, rss, sum(fds.values()) - sum(pooled.values())))
            self.pooled_peak |= pooled  # the peak of each peer's connections over the run
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2)

    async def run(self) -> Tally:
        self.failures: list[str] = []
        self.pooled_peak: Counter[str] = Counter()
        tally = Tally()
        rotation = list(self.replicas)
        limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200)
        clients = {r.port: httpx.AsyncClient(timeout=None, limits=limits) for r in self.replicas}
        stop = asyncio.Event()
        self.load_start = time.monotonic()
        sampler = asyncio.create_task(self.sample(stop))
        chaos = asyncio.create_task(self.chaos(rotation))
        a = self.args
        await load(rotation, clients, tally, a.duration, a.rate, a.burst, a.burst_every, a.deadline, a.seed)
        chaos.cancel()
        stop.set()
        await sampler
        for c in clients.values():
            await c.aclose()
        self.note("load done")
        return tally

    def verdict(self, tally: Tally) -> int:
        a = self.args
        counted = sum(r.counted_before_restart + requests_total(r.metrics_port) for r in self.replicas)
        self.fds_at_end = sockets_of(self.replicas[0].proc.pid, self.port_names())
        faults: Counter[str] = Counter()
        for port in self.proxy_ports:
            faults.update(httpx.get(f"http://127.0.0.1:{port}/_faults").json())
        for r in self.replicas:
            code = r.proc.stop(signal.SIGTERM, 90)
            if not clean_exit(code, r.proc.log):
                self.failures.append(f"{r.proc.name} exited {code} on SIGTERM at the end, not gracefully")
        for p in self.procs:
            p.stop()
        logs = {p.name: p.log.read_text(errors="replace") for p in self.procs if p.log.exists()}
        # After warm-up (the first quarter) against the last quarter. RSS as the median of each window;
        # the other fds as the floor of each (sockets a Redis restart leaves closing for a while lift a
        # window's peak, a leak lifts its floor). Pooled connections (to the upstreams, Redis, clients) are
        # judged apart: a pool follows the load (a burst opens more, Redis's never shrinks), so they moved
        # the total by 14 % between two windows with no leak (CI); a leak outgrows the requests held at once.
        base = [s for s in self.samples if 0.25 * a.duration <= s[0] < 0.5 * a.duration]
        end = [s for s in self.samples if s[0] >= 0.75 * a.duration]
        rss0 = statistics.median(s[1] for s in base) if base else 0
        rss1 = statistics.median(s[1] for s in end) if end else 0
        fd0 = min((s[2] for s in base), default=0)
        fd1 = min((s[2] for s in end), default=0)
        kept_peak = self.replicas[0].peak_in_flight
        total = sum(tally.outcomes.values())
        lost = sum(n for k, n in tally.outcomes.items() if k.startswith("lost"))
        hung = tally.outcomes["hung"]
        no_cause = sum(n for k, n in tally.outcomes.items() if k.startswith("5xx-no-cause"))
        lat = sorted(tally.latencies)
        p50 = lat[len(lat) // 2] if lat else 0.0
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0
        rows = [("duration (s)", f"{a.duration:g}"), ("requests", total), ("answered ok", tally.outcomes["ok"])]
        rows += [(f"  {k}", n) for k, n in sorted(tally.outcomes.items()) if k != "ok"]
        rows += [("lost", lost), ("hung", hung), ("5xx without a cause", no_cause),
                 ("latency p50 / p99 (s)", f"{p50:.3f} / {p99:.3f}"),
                 ("faults injected", ", ".join(f"{k} {n}" for k, n in sorted(faults.items()) if k != "none")),
                 ("upstream calls without a fault", faults["none"]),
                 ("router0 RSS KiB warm / end", f"{rss0:.0f} / {rss1:.0f} ({growth(rss0, rss1):+.1%})"),
                 ("router0 fds but pooled, floor warm / end", f"{fd0:.0f} / {fd1:.0f} ({growth(fd0, fd1):+.1%})"),
                 ("router0 pooled connections, peak", ", ".join(f"{k} {n}" for k, n in sorted(self.pooled_peak.items()))
                  + f" (requests held at once, peak: {kept_peak})"),
                 ("router0 fds at the end", ", ".join(f"{k} {n}" for k, n in sorted(self.fds_at_end.items()))),
                 ("routers' oculis_requests_total", f"{counted:.0f}"),
                 ("responses the load generator saw", tally.responses)]
        width = max(len(str(k)) for k, _ in rows)
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
        for kind, example in tally.examples.items():
            print(f"example of {kind}: {example}")
        if lost:
            self.failures.append(f"{lost} requests lost")
        if hung:
            self.failures.append(f"{hung} requests hung past their {a.deadline:g} s deadline")
        if no_cause:
            self.failures.append(f"{no_cause} 5xx answers without a cause")
        for name, text in logs.items():
            if name.startswith("router") and "Traceback" in text:
                i = text.index("Traceback")
                self.failures.append(f"traceback in {name}.log: {text[i:i + 1500]}")
            for secret in (CLIENT_KEY, UPSTREAM_KEY):
                if secret in text:
                    self.failures.append(f"a secret in {name}.log")
        if growth(rss0, rss1) >= 0.10:
            self.failures.append(f"router0 RSS grew {growth(rss0, rss1):.1%} after warm-up")
        if growth(fd0, fd1) >= 0.10:
            self.failures.append(f"router0 open fds (pooled connections apart) grew {growth(fd0, fd1):.1%} "
                                 "after warm-up")
        for peer, n in sorted(self.pooled_peak.items()):
            # A request holds one client and one upstream connection, and Redis ones for its cache and its
            # limit, at once; + the replica scrapes' own connection.
            if n > 2 * kept_peak + 2:
                self.failures.append(f"router0 held {n} connections to {peer}, more than twice the {kept_peak} "
                                     "requests it held at once: a leak")
        if round(counted) != tally.responses:
            self.failures.append(f"routers counted {counted:.0f} requests, the load generator saw {tally.responses}")
        if sum(v for k, v in faults.items() if k != "none") == 0:
            self.failures.append("no fault was injected: the soak proved nothing")
        if not any("broken file" in e for e in self.events) or not any("restarted and back" in e for e in self.events):
            self.failures.append("the broken reload or the rolling restart did not happen (duration too short?)")
        for f in self.failures:
            print(f"FAIL: {f}")
        print("PASS" if not self.failures else f"{len(self.failures)} failures; logs in {self.work}")
        return 1 if self.failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600, help="seconds of load (default 600)")
    p.add_argument("--rate", type=float, default=15, help="steady requests per second (default 15)")
    p.add_argument("--burst", type=int, default=40, help="requests sent at once in each burst (default 40)")
    p.add_argument("--burst-every", type=float, default=20, help="seconds between bursts (default 20)")
    p.add_argument("--deadline", type=float, default=30, help="seconds a request may take (default 30)")
    p.add_argument("--fault-rate", type=float, default=0.1, help="share of upstream calls faulted (default 0.1)")
    p.add_argument("--reload-every", type=float, default=30, help="seconds between config reloads (default 30)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs) after a pass")
    args = p.parse_args(argv)
    if shutil.which("redis-server") is None:
        print("soak: redis-server is not installed (apt-get install redis-server)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="oculis-soak-"))
    soak = Soak(args, work)
    try:
        soak.setup()
        tally = asyncio.run(soak.run())
        code = soak.verdict(tally)
    finally:
        for proc in soak.procs:
            proc.stop(signal.SIGKILL, 5)
    if code == 0 and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
