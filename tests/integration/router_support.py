"""Helpers shared by the router integration tests: fake upstreams wired into a config, and a
handle on a router under test (kept out of conftest so test modules can import them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml
from fake_upstreams import Script, Server, anthropic_app, free_port, openai_app
from time_scale import Deadline

SECRET = "sk-openai-SECRET-1234"


class Fakes:
    def __init__(self) -> None:
        self.scripts = {n: Script() for n in ("small", "large", "frontier", "claude")}
        self.servers = {n: Server(openai_app(n, self.scripts[n])) for n in ("small", "large", "frontier")}
        self.servers["claude"] = Server(anthropic_app(self.scripts["claude"]))

    def config(self, **route_overrides: Any) -> dict[str, Any]:
        s = self.servers
        route: dict[str, Any] = {
            "name": "adaptive",
            "strategy": "semantic",
            "classifier": {"cache_ttl_seconds": 3600},
            "tiers": [
                {
                    "name": "simple",
                    "match": {"complexity_below": 0.35, "max_prompt_tokens": 2000},
                    "upstream": "llama-8b",
                },
                {"name": "standard", "match": {"complexity_below": 0.75}, "upstream": "llama-70b"},
                {"name": "complex", "match": {}, "upstream": "gpt4o"},
            ],
            "escalation": {"enabled": True, "on_low_confidence": True, "confidence_threshold": 0.6},
            "cache": {
                "enabled": True,
                "ttl_seconds": 3600,
                "key": ["model", "messages", "temperature"],
                "max_entries": 1000,
                "only_when": {"temperature_below": 0.01},
            },
        }
        route.update(route_overrides)
        return {
            "oculis": {
                "upstreams": [
                    {
                        "name": "llama-8b",
                        "provider": "vllm",
                        "base_url": s["small"].url + "/v1",
                        "model": "meta-llama/Llama-3.1-8B-Instruct",
                        "pricing": {"input_per_mtok": 0.05, "output_per_mtok": 0.08},
                    },
                    {
                        "name": "llama-70b",
                        "provider": "vllm",
                        "base_url": s["large"].url + "/v1",
                        "model": "meta-llama/Llama-3.1-70B-Instruct",
                        "pricing": {"input_per_mtok": 0.35, "output_per_mtok": 0.4},
                    },
                    {
                        "name": "gpt4o",
                        "provider": "openai",
                        "base_url": s["frontier"].url + "/v1",
                        "model": "gpt-4o",
                        "api_key_env": "OCULIS_TEST_OPENAI_KEY",
                        "prompt_cache": {"enabled": True, "min_prefix_tokens": 1024},
                        "pricing": {"input_per_mtok": 2.5, "output_per_mtok": 10, "cached_input_per_mtok": 1.25},
                    },
                    {
                        "name": "claude",
                        "provider": "anthropic",
                        "base_url": s["claude"].url + "/v1",
                        "model": "claude-sonnet-4",
                        "api_key_env": "OCULIS_TEST_ANTHROPIC_KEY",
                        "prompt_cache": {"enabled": True, "breakpoints": 2},
                        "pricing": {"input_per_mtok": 3, "output_per_mtok": 15},
                    },
                ],
                "routes": [route, {"name": "via-claude", "tiers": [{"name": "only", "upstream": "claude"}]}],
            }
        }


class RouterHandle:
    def __init__(self, path: Path, server: Server, app: Any) -> None:
        self.path, self.server, self.app = path, server, app
        self.client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-client", max_retries=0, timeout=30)

    def write(self, cfg: dict[str, Any]) -> None:
        self.path.write_text(yaml.safe_dump(cfg))


def start_router(config: Path, log: Path, *extra: str,
                 probe: str = "/readyz") -> tuple[subprocess.Popen[bytes], str, int]:
    """`oculis serve` as a process on free ports, once `probe` answers 200; returns it, its base URL
    and its metrics port."""
    port, mport = free_port(), free_port()
    env = {**os.environ, "OCULIS_TEST_OPENAI_KEY": SECRET, "OCULIS_TEST_ANTHROPIC_KEY": "sk-ant-SECRET-5678"}
    out = open(log, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "oculis_cli.main",
            "serve",
            "--config",
            str(config),
            "--port",
            str(port),
            "--metrics-port",
            str(mport),
            *extra,
        ],
        env=env,
        stdout=out,
        stderr=out,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = Deadline(30)
    while not deadline.expired():
        try:
            if httpx.get(url + probe).status_code == 200:
                return proc, url, mport
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(log.read_text())


def start_prometheus(tmp: Path, jobs: dict[str, list[str]]) -> tuple[subprocess.Popen[bytes], str]:
    """A real Prometheus scraping each job's static targets every second, its data under `tmp`:
    (the process, its base URL). The caller terminates it."""
    port = free_port()
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": targets}]}
                           for job, targets in jobs.items()]}))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"
