"""What serving LoRA adapters costs real vLLM 0.32 on this machine's CPU (issue 26): the tiny model started
without and with `--enable-lora --max-loras 1 --max-lora-rank 8`, side by side: seconds to /health, the
engine's peak RSS (API server, EngineCore and worker), a greedy 16-token completion's latency, and for the
LoRA engine the runtime /v1/load_lora_adapter and /v1/unload_lora_adapter latency of a rank-8 adapter and
the first request for a freshly loaded adapter.

Needs the real-engine tier's virtualenv and tiny model (OCULIS_VLLM_VENV, OCULIS_TINY_MODEL; see
tests/realengine) and holds the machine's engine lock for both starts (one engine at a time):
    .venv/bin/python bench/lora_engine.py [--loads 10] [--port 33100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "realengine"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "suite"))  # realvllm's deadlines (time_scale)
import realvllm

LORA_FLAGS = ("--enable-lora", "--max-loras", "1", "--max-lora-rank", "8")
RUNTIME_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def timed(fn: Any, *args: Any, **kw: Any) -> tuple[float, httpx.Response]:
    t0 = time.monotonic()
    r = fn(*args, **kw)
    return time.monotonic() - t0, r


def completion_s(url: str, model: str, n: int = 5) -> float:
    """Median latency of a greedy 16-token completion (after one warm-up)."""
    body = {"model": model, "prompt": "def main():", "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    out = []
    for i in range(n + 1):
        took, r = timed(httpx.post, f"{url}/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        if i:
            out.append(took)
    return statistics.median(out)


def run(venv: Path, model: Path, port: int, loads: int, work: Path) -> dict[str, dict[str, float]]:
    adapters = realvllm.tiny_adapters(venv, model, work, {"sql": (8, 1), "style": (8, 2)})
    figures: dict[str, dict[str, float]] = {}
    with realvllm.engine_lock():
        for name, flags, env in (("plain", (), None),
                                 ("lora", (*LORA_FLAGS, "--lora-modules", f"sql={adapters['sql']}"), RUNTIME_ENV)):
            engine = realvllm.Engine(venv, model, work / f"vllm-{name}.log", *flags, port=port, env=env)
            try:
                engine.start()
                f = {"start_s": engine.started_s, "base_completion_s": completion_s(engine.url, "tiny")}
                if name == "lora":
                    f["adapter_completion_s"] = completion_s(engine.url, "sql")
                    load, unload, first = [], [], []
                    for _ in range(loads):
                        took, r = timed(httpx.post, f"{engine.url}/v1/load_lora_adapter", timeout=120,
                                        json={"lora_name": "style", "lora_path": str(adapters["style"])})
                        assert r.status_code == 200, r.text
                        load.append(took)
                        took, r = timed(httpx.post, f"{engine.url}/v1/completions", timeout=120, json={
                            "model": "style", "prompt": "x", "max_tokens": 1})
                        assert r.status_code == 200, r.text
                        first.append(took)
                        took, r = timed(httpx.post, f"{engine.url}/v1/unload_lora_adapter", timeout=120,
                                        json={"lora_name": "style"})
                        assert r.status_code == 200, r.text
                        unload.append(took)
                    f |= {"load_p50_s": statistics.median(load), "load_max_s": max(load),
                          "unload_p50_s": statistics.median(unload),
                          "first_request_after_load_p50_s": statistics.median(first)}
                f["peak_rss_gib"] = engine.rss_bytes() / 2**30
                figures[name] = f
            finally:
                engine.stop()
    return figures


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--loads", type=int, default=10, help="load/serve/unload cycles of the runtime adapter")
    p.add_argument("--port", type=int, default=0, help="the engines' port (0: a free one)")
    a = p.parse_args()
    venv = realvllm.venv_dir()
    if problem := realvllm.venv_problem(venv):
        print(f"lora_engine: {problem}", file=sys.stderr)
        return 2
    model = realvllm.tiny_model(venv)
    with tempfile.TemporaryDirectory(prefix="oculis-lora-bench-") as work:
        figures = run(venv, model, a.port or realvllm.free_port(), a.loads, Path(work))
    keys = sorted({k for f in figures.values() for k in f}, key=lambda k: list(figures["lora"]).index(k)
                  if k in figures["lora"] else -1)
    print(f"vLLM {realvllm.VLLM_VERSION} on CPU, tiny model, --enforce-eager; 'lora' = {' '.join(LORA_FLAGS)}")
    print(f"{'figure':34} {'plain':>10} {'lora':>10}")
    for k in keys:
        cells = [f"{figures[n][k]:10.3f}" if k in figures[n] else f"{'-':>10}" for n in ("plain", "lora")]
        print(f"{k:34} {' '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
