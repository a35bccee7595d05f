"""LoRA adapters on the simulator, as vLLM 0.32 serves them (`--enable-lora --max-loras N
--lora-modules name=path ...`): each adapter is a model name of its own, listed by /v1/models with its
`parent` (the first served name) and `root` (its path); `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter` answer with vLLM's words (vllm/entrypoints/openai/models/serving.py), and exist
only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1/true in the environment, as in vLLM (otherwise a 404, as
FastAPI answers a route that is not there); `vllm:lora_requests_info{max_lora, running_lora_adapters,
waiting_lora_adapters}` is exported.

A runtime load reads the adapter as vLLM does: a local folder (an absolute path, `~`, or a relative one
that exists) must hold `adapter_config.json`, else vLLM's 404 "Loading lora NAME failed: No adapter found
for PATH"; any other name is a Hugging Face repository, which the simulator takes as downloaded (it
fetches nothing) unless HF_HUB_OFFLINE is set, when vLLM finds nothing either. A config it reads is
checked as vLLM checks it (peft_helper.py validate_legal): a rank above --max-lora-rank, a bias or DoRA
is vLLM's 500 as the worker words it; a config missing vLLM's required fields (r, lora_alpha,
target_modules) is accepted (vLLM: a 500; the sandbox's test adapters are such stubs). Adapters named
at start (--lora-modules) are read only where the folder is on this machine (the sandbox's pods name paths
of their own volumes: the stand-in sets OCULIS_SIM_POD_PATHS); elsewhere a local path that does not exist is
vLLM's "No adapter found"; a bad one stops the start, as it stops vLLM's. Held to real vLLM by
tests/realengine/test_lora_real.py; the success text comes as text/plain (vLLM sends no Content-Type).

The slot limit: at most `max_loras` distinct adapters run in one step; a request for another waits
(vLLM's scheduler skips it until a slot frees), and a first request for an adapter that is not in a GPU
slot pays its load time (LOAD_S, a CPU-to-GPU copy of a small adapter). The engine's scheduler is not
changed: the wait is modelled here, before the request enters it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge

from oculis_sim import FINGERPRINT, lora_flags
from oculis_sim.api_request import ApiError, json_error, media_type_error, schema_errors
from oculis_sim.config import SimConfigError

FLAGS = ("--enable-lora", "--max-loras", "--max-lora-rank", "--lora-modules")
LOAD_S = 0.05  # first use of an adapter not in a GPU slot: a few MB copied host-to-device
RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
# Set by the sandbox's pod stand-in (e2e/podstandin.py): --lora-modules paths are the pod's volumes, not this
# machine's, so a folder that is not here is taken as loaded.
POD_PATHS_ENV = "OCULIS_SIM_POD_PATHS"


def _true(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "0").strip().lower() in ("1", "true")  # vllm/envs.py reads it so


def adapter_found(path: str, hf_offline: bool) -> bool:
    """Whether vLLM 0.32 would find the adapter (vllm/lora/utils.py get_adapter_absolute_path, then
    PEFTHelper reading adapter_config.json): a local folder must hold its config; a Hugging Face id is
    taken as fetched unless offline."""
    local = os.path.expanduser(path)
    if os.path.isabs(local) or os.path.exists(local):
        return os.path.isfile(os.path.join(local, "adapter_config.json"))
    return not hf_offline


def into_slot(slots: list[str], name: str, max_loras: int, running: Counter[str]) -> bool:
    """Put adapter `name` in a GPU slot (`slots`: least recently used first); True when it had to be loaded.
    A full set of slots evicts the least recently used adapter no request is running with."""
    if name in slots:
        slots.remove(name)
        slots.append(name)
        return False
    if len(slots) >= max_loras:
        idle = next((a for a in slots if not running.get(a)), None)
        if idle is not None:
            slots.remove(idle)
    slots.append(name)
    return True


@dataclass
class Adapters:
    """The adapters one engine serves and which of them hold a GPU slot."""

    base: str  # the first served name: every adapter's parent
    max_loras: int
    max_lora_rank: int = 16
    modules: dict[str, str] = field(default_factory=dict)  # name -> path
    running: Counter[str] = field(default_factory=Counter)  # adapter -> requests running
    waiting: Counter[str] = field(default_factory=Counter)
    slots: list[str] = field(default_factory=list)  # adapters in GPU slots, least recently used first
    freed: asyncio.Event | None = None
    on_change: Callable[[], None] | None = None  # refreshes vllm:lora_requests_info
    runtime_updating: bool = False  # VLLM_ALLOW_RUNTIME_LORA_UPDATING: the load/unload endpoints exist
    hf_offline: bool = False  # HF_HUB_OFFLINE: a Hugging Face id cannot be fetched

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def names(self) -> tuple[str, ...]:
        return tuple(self.modules)

    def cards(self, now: int, permission: dict[str, Any]) -> list[dict[str, Any]]:
        """/v1/models entries, as vLLM's ModelCard for a LoRA (no max_model_len)."""
        return [{"id": n, "object": "model", "created": now, "owned_by": FINGERPRINT, "root": p,
                 "parent": self.base, "max_model_len": None, "permission": [permission]}
                for n, p in self.modules.items()]

    async def acquire(self, name: str) -> None:
        """Wait for a slot among max_loras (a step runs at most that many distinct adapters), paying the
        load time when the adapter is not in one."""
        self.freed = self.freed or asyncio.Event()
        self.waiting[name] += 1
        self._changed()
        try:
            while name not in self.running and len(+self.running) >= self.max_loras:
                self.freed.clear()
                await self.freed.wait()
            if into_slot(self.slots, name, self.max_loras, self.running):
                await asyncio.sleep(LOAD_S)
        finally:
            self.waiting[name] -= 1
        self.running[name] += 1
        self._changed()

    def release(self, name: str) -> None:
        self.running[name] -= 1
        self.running = +self.running  # drop zero counts
        if self.freed is not None:
            self.freed.set()
        self._changed()

    def load(self, body: dict[str, Any]) -> tuple[int, str | dict[str, Any]]:
        if err := _fields_error(body, ("lora_name", "lora_path")):
            return err.status, err.body()
        name, path = body["lora_name"], body["lora_path"]
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name == self.base:
            return _error(400, f"The lora adapter '{name}' conflicts with a served base model.", "InvalidUserInput")
        if name in self.modules and not body.get("load_inplace"):
            return _error(400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter "
                          "in place, set 'load_inplace' to True.", "InvalidUserInput")
        if not adapter_found(str(path), self.hf_offline):  # vllm.exceptions.LoRAAdapterNotFoundError
            return _error(404, sanitized(f"Loading lora {name} failed: No adapter found for {path}"), "NotFoundError")
        if err := adapter_problem(path, self.max_lora_rank):
            return err.status, err.body()
        self.modules[str(name)] = str(path)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def unload(self, body: dict[str, Any]) -> tuple[int, str | dict[str, Any]]:
        if err := _fields_error(body, ("lora_name",)):
            return err.status, err.body()
        name = body["lora_name"]
        if not name:
            return _error(400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput")
        if name not in self.modules:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.modules[name]
        if name in self.slots:
            self.slots.remove(name)
        return 200, f"Success: LoRA adapter '{name}' removed successfully."


def _error(status: int, message: str, err_type: str) -> tuple[int, dict[str, Any]]:
    return status, ApiError(status, message, err_type).body()


def _fields_error(body: dict[str, Any], required: tuple[str, ...]) -> ApiError | None:
    """The request model's validation (Load/UnloadLoRAAdapterRequest: these fields are required strings)."""
    errors = [("missing", (f,), "Field required", body) if f not in body else
              ("string_type", (f,), "Input should be a valid string", body[f])
              for f in required if not isinstance(body.get(f), str)]
    return schema_errors(errors) if errors else None


# vLLM's sanitize_message (vllm/entrypoints/serve/exception_handling/utils.py): paths under these roots, and
# any path ending in a file name with an extension, become <path> in an error message.
_ROOTED = re.compile(r"/(?:home|usr|opt|var|tmp|root|lib|mnt|srv)(?:/[\w.\-]+)+")
_FILE = re.compile(r"(?:/[\w\-]+)+/[\w\-]+\.\w+")


def sanitized(message: str) -> str:
    return _FILE.sub("<path>", _ROOTED.sub("<path>", message)).strip()


def adapter_problem(path: str, max_lora_rank: int) -> ApiError | None:
    """vLLM's refusal of the adapter config at `path` when the folder is on this machine (the worker's
    add_lora: PEFTHelper.validate_legal), else None."""
    config_file = Path(path).expanduser() / "adapter_config.json"
    if not config_file.is_file():
        return None
    try:
        cfg = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _worker_failure(str(exc))
    if not isinstance(cfg, dict):
        return _worker_failure(f"{config_file}: not a JSON object")
    problems = []
    if cfg.get("use_dora"):
        problems.append("vLLM does not yet support DoRA.")
    ranks = [r for r in (cfg.get("r"), *(cfg.get("rank_pattern") or {}).values()) if isinstance(r, int)]
    if ranks and max(ranks) > max_lora_rank:
        problems.append(f"LoRA rank {max(ranks)} is greater than max_lora_rank {max_lora_rank}.")
    if cfg.get("bias", "none") != "none":
        problems.append("Adapter bias is not supported.")
    return _worker_failure(" ".join(problems)) if problems else None


def _worker_failure(message: str) -> ApiError:
    """An exception in the worker's add_lora, as the engine core and then the API server relay it (a 500)."""
    return ApiError(500, sanitized(f"Call to add_lora method failed: Worker failed with error '{message}', please "
                                   "check the stack trace above for the root cause"), "InternalServerError")


def from_args(ignored: list[str], base: str, env: Mapping[str, str] | None = None) -> tuple[Adapters | None, list[str]]:
    """The adapters the LoRA flags among `ignored` (what the simulator's own parser left) ask for, and the
    rest; `env` (default: this process's) says whether runtime loading is allowed. None without
    --enable-lora (vLLM then serves no adapter)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--lora-modules", nargs="+", default=[])
    args, rest = p.parse_known_args(ignored)
    lora_flags.check(args.enable_lora, args.lora_modules, args.max_loras, args.max_lora_rank)
    if not args.enable_lora:
        return None, ignored
    modules = lora_flags.lora_modules(args.lora_modules)
    env = os.environ if env is None else env
    adapters = Adapters(base, max(1, args.max_loras), args.max_lora_rank, modules,
                        runtime_updating=_true(env, RUNTIME_ENV),
                        hf_offline=(env.get("HF_HUB_OFFLINE") or "").upper() in ("1", "ON", "YES", "TRUE"))
    elsewhere = _true(env, POD_PATHS_ENV)
    for name, path in modules.items():  # vLLM's start fails on a static adapter it cannot load
        folder = Path(path).expanduser()
        if not folder.exists():
            # a folder that is not here: a Hugging Face id (taken as fetched unless offline), or, for the sandbox's
            # pod stand-in, a path of the pod's own volumes; else vLLM's refusal (QA3 Part 2 #10: it was served)
            found = elsewhere or adapter_found(path, adapters.hf_offline)
            problem: ApiError | str | None = None if found else "No adapter found for " + path
        else:
            problem = (adapter_problem(path, adapters.max_lora_rank) if (folder / "adapter_config.json").is_file()
                       else "No adapter found for " + path)
        if problem is not None:
            raise SimConfigError(f"--lora-modules {name}={path}: "
                                 f"{problem.message if isinstance(problem, ApiError) else problem}")
    return adapters, rest


def add_routes(app: web.Application, adapters: Adapters, registry: CollectorRegistry | None = None) -> None:
    """The runtime load/unload endpoints (vLLM has them only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) and
    the lora_requests_info gauge (value: the time of the last change, labels: the state). A request for an
    adapter not loaded is vLLM's 404 listing only the base names ("Valid aliases: tiny.", measured)."""

    async def body_of(request: web.Request) -> dict[str, Any]:
        """The JSON object, or FastAPI's refusal as vLLM words it."""
        if err := media_type_error(request.headers.get("Content-Type", "")):
            raise err
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise json_error(exc) from None
        except UnicodeDecodeError:
            raise json_error(json.JSONDecodeError("invalid UTF-8", "", 0)) from None
        if not isinstance(body, dict):
            raise schema_errors([("model_attributes_type", (), "Input should be a valid dictionary or object to "
                                  "extract fields from", body)])
        return body

    async def answer(request: web.Request, handle: Callable[[dict[str, Any]], tuple[int, str | dict[str, Any]]]
                     ) -> web.Response:
        try:
            status, out = handle(await body_of(request))
        except ApiError as err:
            status, out = err.status, err.body()
        return web.json_response(out, status=status) if isinstance(out, dict) else web.Response(text=out)

    async def load(request: web.Request) -> web.Response:
        return await answer(request, adapters.load)

    async def unload(request: web.Request) -> web.Response:
        return await answer(request, adapters.unload)

    async def absent(request: web.Request) -> web.Response:  # FastAPI's answer for a route it does not have
        return web.json_response({"detail": "Not Found"}, status=404)

    app.router.add_post("/v1/load_lora_adapter", load if adapters.runtime_updating else absent)
    app.router.add_post("/v1/unload_lora_adapter", unload if adapters.runtime_updating else absent)
    if registry is not None:
        info = Gauge("vllm:lora_requests_info", "Running stats on lora requests.",
                     ["max_lora", "running_lora_adapters", "waiting_lora_adapters"], registry=registry)

        def refresh() -> None:  # vLLM keeps every label set it has shown, each at the time it last held
            info.labels(str(adapters.max_loras), ",".join(sorted(+adapters.running)),
                        ",".join(sorted(+adapters.waiting))).set_to_current_time()

        refresh()
        adapters.on_change = refresh
