"""Hot reload survives whatever is written to the config file: a bad write is rejected and logged
once, the last good config keeps serving, and the next good write applies."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from oculis_router import state
from oculis_router.metrics import Metrics
from oculis_router.state import ConfigHolder


def config(*routes: str) -> str:
    return yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "ok", "provider": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "m"}],
        "routes": [{"name": r, "tiers": [{"name": "a", "upstream": "ok"}]} for r in routes]}})


def counted(metrics: Metrics, result: str) -> float:
    return metrics.registry.get_sample_value("oculis_config_reloads_total", {"result": result}) or 0.0


async def until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if cond():
            return
        await asyncio.sleep(0.005)
    pytest.fail(f"never happened: {what}")


BAD_WRITES = {
    "invalid UTF-8": b"oculis:\n  upstreams: []\n\xff\xfe\n",
    "nested past the recursion limit": b"oculis: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "invalid YAML": b"oculis: {upstreams: [\n",
    "schema error": b"oculis: {upstreams: [{name: x, provider: nonsense}]}\n",
    "not a mapping": b"- 1\n- 2\n",
}


@pytest.mark.parametrize("bad", list(BAD_WRITES.values()), ids=list(BAD_WRITES))
def test_reload_watcher_survives_any_bad_write_and_applies_the_next_good_one(
        tmp_path: Path, bad: bytes, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "oculis-config.yaml"
    path.write_text(config("first"))
    metrics = Metrics()
    holder = ConfigHolder(path, metrics)

    async def scenario() -> None:
        watcher = asyncio.create_task(holder.watch(0.001))
        try:
            path.write_bytes(bad)
            await until(lambda: counted(metrics, "rejected") == 1, "the bad write to be rejected")
            assert set(holder.current.routes) == {"first"}  # the last good config keeps serving
            path.write_text(config("first", "second"))
            await until(lambda: "second" in holder.current.routes, "the next good write to apply")
            assert not watcher.done()
        finally:
            watcher.cancel()

    with caplog.at_level(logging.INFO, logger="oculis.router"):
        asyncio.run(scenario())
    rejections = [r for r in caplog.records if "rejected new config" in r.getMessage()]
    assert len(rejections) == 1 and rejections[0].levelno == logging.ERROR  # logged once, not once a tick
    assert rejections[0].exc_info is None  # a bad file is the writer's mistake: no traceback
    assert counted(metrics, "applied") == 1 and holder.watch_stopped is None


def test_a_setting_that_fails_to_build_is_a_rejection_not_the_end_of_reloads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oculis-config.yaml"
    path.write_text(config("first"))
    metrics = Metrics()
    holder = ConfigHolder(path, metrics)
    real = state.RouteScorer

    def scorer(route: state.Route) -> state.RouteScorer:
        if route.name == "broken":
            raise ImportError("a library this setting needs is missing")
        return real(route)

    monkeypatch.setattr(state, "RouteScorer", scorer)
    path.write_text(config("first", "broken"))
    holder.tick()
    assert counted(metrics, "rejected") == 1 and set(holder.current.routes) == {"first"}
    path.write_text(config("first", "third"))
    holder.tick()
    assert set(holder.current.routes) == {"first", "third"}


def test_an_unreadable_file_is_retried_and_said_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "oculis-config.yaml"
    path.write_text(config("first"))
    holder = ConfigHolder(path, Metrics())
    path.write_text(config("first", "second"))
    real = Path.read_bytes

    def unreadable(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", unreadable)
    with caplog.at_level(logging.WARNING, logger="oculis.router"):
        for _ in range(3):
            holder.tick()
    assert len([r for r in caplog.records if "unreadable" in r.getMessage()]) == 1
    monkeypatch.setattr(Path, "read_bytes", real)
    holder.tick()  # the same file, readable again: applied although its mtime did not change since
    assert "second" in holder.current.routes


def test_a_stopped_watcher_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oculis-config.yaml"
    path.write_text(config("first"))
    holder = ConfigHolder(path, Metrics())

    def dies() -> None:
        raise SystemExit("pulled out from under it")

    monkeypatch.setattr(holder, "tick", dies)

    async def scenario() -> None:
        with pytest.raises(SystemExit):
            await holder.watch(0.001)

    asyncio.run(scenario())
    assert holder.watch_stopped == "SystemExit: pulled out from under it"


def test_stores_a_reload_dropped_are_closed_later(tmp_path: Path) -> None:
    path = tmp_path / "oculis-config.yaml"
    cached = yaml.safe_load(config("first"))
    cached["oculis"]["routes"][0]["cache"] = {"enabled": True, "max_entries": 10}
    path.write_text(yaml.safe_dump(cached))
    holder = ConfigHolder(path, Metrics())
    old = holder.current.routes["first"].store
    assert old is not None
    cached["oculis"]["routes"][0]["cache"]["max_entries"] = 20  # a new store; the old one is retired
    path.write_text(yaml.safe_dump(cached))
    holder.tick()
    assert holder.current.routes["first"].store is not old
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    old.close = close  # type: ignore[method-assign]
    asyncio.run(holder._close_retired(state.RETIRE_AFTER_S))
    assert not closed  # in-flight requests of the old snapshot may still use it
    asyncio.run(holder._close_retired(0))
    assert closed == [True]


def test_a_config_refused_late_in_its_build_leaves_the_stores_in_force_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "oculis-config.yaml"
    cfg = yaml.safe_load(config("first"))
    cfg["oculis"]["routes"][0]["cache"] = {"enabled": True, "max_entries": 10}
    path.write_text(yaml.safe_dump(cfg))
    metrics = Metrics()
    holder = ConfigHolder(path, metrics)
    store = holder.current.routes["first"].store

    def refused(*_: object) -> None:
        raise ValueError("the limiter's backend cannot be built")

    monkeypatch.setattr(state, "build_limiter", refused)
    cfg["oculis"]["routes"][0]["cache"]["max_entries"] = 20  # would replace the store...
    cfg["oculis"]["routes"][0]["limits"] = {"requests_per_minute": 5}  # ...but the limiter fails
    path.write_text(yaml.safe_dump(cfg))
    holder.tick()
    assert counted(metrics, "rejected") == 1 and holder.current.routes["first"].store is store
    assert all(s is not store for _, s in holder._retired)  # not to be closed under the config in force


def test_hot_reload_retries_a_rejected_config_on_touch_and_periodically(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A config refused for a reason outside the file (here a setting whose build fails until it is
    fixed) is tried again when the same bytes are written again (`touch`) and every RETRY_REJECTED_S,
    and said again only when its reason changes (QA pass 2, finding 1)."""
    import os
    import time

    path = tmp_path / "oculis-config.yaml"
    path.write_text(config("first"))
    metrics = Metrics()
    holder = ConfigHolder(path, metrics)
    real, broken = state.RouteScorer, {"yes": True}

    def scorer(route: state.Route) -> state.RouteScorer:
        if route.name == "second" and broken["yes"]:
            raise ValueError("not yet")
        return real(route)

    monkeypatch.setattr(state, "RouteScorer", scorer)
    path.write_text(config("first", "second"))
    with caplog.at_level(logging.INFO, logger="oculis.router"):
        holder.tick()
        assert holder.rejected is not None and set(holder.current.routes) == {"first"}
        for _ in range(3):
            holder.tick()
        assert counted(metrics, "rejected") == 1  # once, not once a tick
        assert holder.retry_rejected(now=time.monotonic() + state.RETRY_REJECTED_S + 1) is False
        assert counted(metrics, "rejected") == 1  # the periodic retry failed for the same reason: not said again
        broken["yes"] = False
        st = path.stat()
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # `touch`: same bytes, new stamp
        holder.tick()
    assert set(holder.current.routes) == {"first", "second"} and holder.rejected is None
    assert counted(metrics, "applied") == 1

    path.write_text(config("first", "second", "third"))
    broken["yes"] = True
    monkeypatch.setattr(state, "RouteScorer", lambda route: (_ for _ in ()).throw(ValueError("down"))
                        if route.name == "third" and broken["yes"] else real(route))
    holder.tick()
    assert "third" not in holder.current.routes
    broken["yes"] = False
    holder.tick()  # not due yet: no change to any file it reads
    assert "third" not in holder.current.routes
    assert holder.retry_rejected(now=time.monotonic() + state.RETRY_REJECTED_S + 1) is True
    assert "third" in holder.current.routes


def test_a_file_too_large_to_read_is_not_retried_until_written_again(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    path = tmp_path / "oculis-config.yaml"
    path.write_text(config("first"))
    metrics = Metrics()
    holder = ConfigHolder(path, metrics)
    monkeypatch.setattr(state, "MAX_CONFIG_BYTES", 10)
    path.write_text(config("first", "second"))
    holder.tick()
    assert holder.rejected is not None and "larger than any configuration" in holder.rejected.reason
    assert holder.retry_rejected(now=time.monotonic() + state.RETRY_REJECTED_S + 1) is False
    assert counted(metrics, "rejected") == 1 and "larger" in holder.rejected.reason  # not re-read as empty
