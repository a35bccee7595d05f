"""Router overhead, side by side in one run: direct to a fast fake upstream, through Oculis, and
through the LiteLLM proxy (one worker, same upstream), at several concurrencies.

Load comes from wrk (C, keep-alive) posting the same chat request; Oculis routes it through a
semantic route whose classifier memo is warm (the prompt repeats) with the response cache off, so
every request reaches the upstream. Prints p50/p99 latency, added p50 over direct, requests/s and
the proxy process's CPU time per request.

    .venv/bin/python bench/router_overhead.py [--seconds 10] [--concurrency 1 32 256]
Needs `wrk` (Debian package) and, for the LiteLLM column, a venv with `litellm[proxy]`
(created at ~/.cache/oculis-bench/litellm-venv when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent
LITELLM_VENV = Path.home() / ".cache" / "oculis-bench" / "litellm-venv"
BODY = {
    "model": "M",
    "messages": [{"role": "user", "content": "Translate 'good morning' into French."}],
    "max_tokens": 16,
    "temperature": 0.7,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, model: str, conns: int, seconds: int, work: Path) -> dict[str, float]:
    body = json.dumps({**BODY, "model": model})
    script = work / f"post-{model}.lua"
    script.write_text(
        f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        'wrk.headers["Authorization"] = "Bearer sk-bench"\n'
    )
    threads = 1 if conns == 1 else 2
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{seconds}s", "--latency", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "p50": ms("50%"),
        "p99": ms("99%"),
        "rps": rps,
        "requests": total,
        "errors": float(errors.group(1)) if errors else 0.0,
    }


def ensure_litellm() -> Path | None:
    exe = LITELLM_VENV / "bin" / "litellm"
    if exe.exists():
        return exe
    try:
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(LITELLM_VENV / "bin" / "pip"), "install", "-q", "litellm[proxy]"], check=True)
    except subprocess.CalledProcessError:
        return None
    return exe if exe.exists() else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--skip-litellm", action="store_true")
    args = ap.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found: apt-get install -y wrk")
    work = Path(tempfile.mkdtemp(prefix="oculis-overhead-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        fport = free_port()
        procs.append(subprocess.Popen([sys.executable, str(ROOT / "fake_upstream.py"), str(fport)]))
        fake = f"http://127.0.0.1:{fport}"
        time.sleep(0.5)
        cfg = {
            "oculis": {
                "upstreams": [
                    {
                        "name": "fake",
                        "provider": "vllm",
                        "base_url": fake + "/v1",
                        "model": "fake",
                        "pricing": {"input_per_mtok": 0.05, "output_per_mtok": 0.08},
                    }
                ],
                "routes": [
                    {
                        "name": "adaptive",
                        "tiers": [
                            {"name": "simple", "match": {"complexity_below": 0.35}, "upstream": "fake"},
                            {"name": "complex", "match": {}, "upstream": "fake"},
                        ],
                    }
                ],
            }
        }
        (work / "oculis.yaml").write_text(yaml.safe_dump(cfg))
        oport = free_port()
        oculis = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oculis_cli.main",
                "serve",
                "--config",
                str(work / "oculis.yaml"),
                "--port",
                str(oport),
                "--metrics-port",
                str(free_port()),
                "--log-level",
                "warning",
            ]
        )
        procs.append(oculis)
        wait_http(f"http://127.0.0.1:{oport}/healthz")
        targets: list[tuple[str, str, str, int | None]] = [
            ("direct", fake + "/v1/chat/completions", "fake", None),
            ("oculis", f"http://127.0.0.1:{oport}/v1/chat/completions", "adaptive", oculis.pid),
        ]
        litellm = None if args.skip_litellm else ensure_litellm()
        if litellm:
            lport = free_port()
            (work / "litellm.yaml").write_text(
                yaml.safe_dump(
                    {
                        "model_list": [
                            {
                                "model_name": "fake",
                                "litellm_params": {
                                    "model": "openai/fake",
                                    "api_base": fake + "/v1",
                                    "api_key": "sk-fake",
                                },
                            }
                        ],
                        "litellm_settings": {"telemetry": False, "set_verbose": False},
                    }
                )
            )
            env = {
                **os.environ,
                "LITELLM_LOG": "ERROR",
                "LITELLM_TELEMETRY": "False",
                "NO_DOCS": "True",
                "LITELLM_MASTER_KEY": "sk-bench",
            }  # wrk sends this key
            lp = subprocess.Popen(
                [
                    str(litellm),
                    "--config",
                    str(work / "litellm.yaml"),
                    "--port",
                    str(lport),
                    "--host",
                    "127.0.0.1",
                    "--num_workers",
                    "1",
                ],
                env=env,
                stdout=open(work / "litellm.log", "wb"),  # noqa: SIM115 (the child owns it)
                stderr=subprocess.STDOUT,
            )
            procs.append(lp)
            wait_http(f"http://127.0.0.1:{lport}/health/liveliness", timeout=180)
            targets.append(("litellm", f"http://127.0.0.1:{lport}/v1/chat/completions", "fake", lp.pid))
        for _name, url, model, _ in targets:  # warm up: connections, classifier memo, imports
            wrk(url, model, 4, 2, work)
        print(
            f"{'conc':>4} {'target':8} {'p50 ms':>8} {'p99 ms':>8} {'added p50':>10} {'req/s':>9} "
            f"{'CPU ms/req':>10} {'errors':>6}"
        )
        for conns in args.concurrency:
            base = None
            for name, url, model, pid in targets:
                cpu0 = cpu_seconds(pid) if pid else 0.0
                r = wrk(url, model, conns, args.seconds, work)
                cpu = (cpu_seconds(pid) - cpu0) * 1000 / max(r["requests"], 1) if pid else float("nan")
                if name == "direct":
                    base = r["p50"]
                added = r["p50"] - base if base is not None and name != "direct" else 0.0
                print(
                    f"{conns:>4} {name:8} {r['p50']:8.3f} {r['p99']:8.3f} {added:10.3f} {r['rps']:9.0f} "
                    f"{cpu:10.3f} {int(r['errors']):>6}",
                    flush=True,
                )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
