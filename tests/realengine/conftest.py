"""The real-engine tier: real vLLM on CPU (tests/realengine/install.sh) serving a tiny model built at test
time from local text. One engine runs at a time: `engines.get(...)` stops the running one before it
starts another, and every start holds the machine-wide lock (realvllm.lock_path()). Engines are shared
across a session per configuration, so a module asks for the configuration it needs and the tier pays
for each start once. A machine that cannot install vLLM skips the tier with the installer's reason
(under CI=true only where the reason is inherent to the machine: tests/suite/skip_causes.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent / "integration"))  # fake_upstreams.Server, router_support
sys.path.insert(2, str(HERE.parents[1] / "e2e" / "tests"))  # e2e_support.eventually
import realvllm  # noqa: E402
from skip_causes import parse  # noqa: E402
from skips import skip_or_fail  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    ours = [i for i in items if HERE in Path(str(i.fspath)).parents]
    for item in ours:
        item.add_marker(pytest.mark.realengine)
    # Tests grouped by the engine they use, so each configuration starts once per session (the LoRA
    # engine's tests are those that use the tiny adapters).
    order = {name: n for n, name in enumerate(("vllm_venv", "engine", "pressure_engine", "tiny_adapters"))}

    def rank(item: pytest.Item) -> int:
        used = [order[f] for f in getattr(item, "fixturenames", ()) if f in order]
        return max(used, default=-1)

    if ours:
        first = items.index(ours[0])
        rest = [i for i in items if i not in set(ours)]
        items[:] = rest[:first] + sorted(ours, key=rank) + rest[first:]


STATS = realvllm.STATS  # test modules add their figures there (a conftest is not importable by name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in STATS.values():
        terminalreporter.write_line(f"realengine: {line}")


@pytest.fixture(scope="session")
def tier_stats() -> dict[str, str]:
    """Figures a test measured, printed with the tier's summary (tests assert behaviour, never timings)."""
    return STATS


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    venv = realvllm.venv_dir()
    if problem := realvllm.venv_problem(venv):
        skip_or_fail(parse(problem))
    return venv


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path) -> Path:
    return realvllm.tiny_model(vllm_venv)


# The configurations the tier starts, by name. "default": the plain engine (API, router, logprobs,
# prefix caching; usage.prompt_tokens_details only comes with its flag). "pressure": a KV cache of a few
# blocks and 4 sequences, so a burst queues and preempts for real, with ngram speculative decoding so the
# acceptance counters exist.
CONFIGS: dict[str, tuple[str, ...]] = {
    "default": ("--enable-prompt-tokens-details",),
    "pressure": ("--kv-cache-memory-bytes", "1M", "--max-num-seqs", "4",
                 "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'),
    # LoRA adapters (issue 26): one GPU slot, rank up to 8, adapters loaded and unloaded at run time; the
    # test adds its static --lora-modules (the adapters are built at test time).
    "lora": ("--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"),
    # The LoRA engine keyed as the operator keys it (issue 35): VLLM_API_KEY from the environment.
    "keyed": ("--enable-lora", "--max-loras", "1", "--max-lora-rank", "8"),
    # flow control's priorities reaching the engine (issue 32): vLLM's priority scheduling
    "priority": ("--scheduling-policy", "priority"),
}
ENVS: dict[str, dict[str, str]] = {"lora": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
                                   "keyed": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                                             "VLLM_API_KEY": "oculis-realengine-" + "k" * 32}}


class Engines:
    """At most one running engine, kept while tests ask for the same configuration."""

    def __init__(self, venv: Path, model: Path, logs: Path) -> None:
        self.venv, self.model, self.logs = venv, model, logs
        self.name: str | None = None
        self.extra: tuple[str, ...] = ()
        self.current: realvllm.Engine | None = None
        self._stack = contextlib.ExitStack()
        self.starts: dict[str, float] = {}
        self.peak_rss: dict[str, int] = {}

    def get(self, name: str, *extra: str) -> realvllm.Engine:
        """The engine of configuration `name` (plus `extra` flags), started unless it runs already."""
        if self.name == name and self.extra == extra and self.current and self.current.proc \
                and self.current.proc.poll() is None:
            return self.current
        self.close()
        flags = (*CONFIGS[name], *extra)
        kv_gib = None if "--kv-cache-memory-bytes" in flags else 1  # the flag, not the variable, sizes it then
        self.current = self._stack.enter_context(
            realvllm.running(self.venv, self.model, self.logs / f"vllm-{name}.log", *flags, kv_cache_gib=kv_gib,
                             env=ENVS.get(name)))
        self.name, self.extra = name, extra
        self.starts[name] = self.current.started_s
        return self.current

    def note_rss(self) -> None:
        if self.current and self.name:
            self.peak_rss[self.name] = max(self.peak_rss.get(self.name, 0), self.current.rss_bytes())

    def close(self) -> None:
        self.note_rss()
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self.name, self.current = None, None


LIVE: list[Engines] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    # The last test of the tier stops its engine (and frees the machine's engine lock) at once, not at the
    # end of the session: later tests (e2e/tests/test_real_engine_on_pods.py) take the lock themselves.
    if LIVE and (nextitem is None or HERE not in Path(str(nextitem.fspath)).parents):
        LIVE[0].close()


@pytest.fixture(scope="session")
def engines(vllm_venv: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    e = Engines(vllm_venv, tiny_model, tmp_path_factory.mktemp("vllm-logs"))
    LIVE.append(e)
    yield e
    e.close()
    LIVE.remove(e)
    for name, seconds in e.starts.items():
        STATS[name] = (f"engine {name!r} (vLLM {realvllm.VLLM_VERSION}, --enforce-eager) answered /health "
                       f"{seconds:.0f}s after start; peak RSS {e.peak_rss.get(name, 0) / 2**30:.2f} GiB")


@pytest.fixture
def engine(engines: Engines) -> Iterator[realvllm.Engine]:
    """The default engine (shared by every test that asks for it while it runs)."""
    yield engines.get("default")
    engines.note_rss()


@pytest.fixture(scope="session")
def tiny_adapters(vllm_venv: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """LoRA adapters for the tiny model (tinyadapter.py): two of rank 8, one of rank 16 (above the LoRA
    engine's --max-lora-rank 8), and a folder with no adapter in it."""
    root = tmp_path_factory.mktemp("adapters")
    out = realvllm.tiny_adapters(vllm_venv, tiny_model, root, {"sql": (8, 1), "style": (8, 2), "wide": (16, 3)})
    (root / "empty").mkdir()
    return {**out, "empty": root / "empty"}


@pytest.fixture
def pressure_engine(engines: Engines) -> Iterator[realvllm.Engine]:
    yield engines.get("pressure")
    engines.note_rss()
