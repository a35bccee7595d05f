"""Where the Batch API keeps its files and batches: a directory, one folder per tenant (named by a digest
of the tenant, so a tenant header can never name a path, and no lookup can reach another tenant's folder).

    <root>/<tenant digest>/files/<file id>.json     the file object (OpenAI's shape)
    <root>/<tenant digest>/files/<file id>.data     its bytes
    <root>/<tenant digest>/batches/<batch id>.json  the batch object, plus who it runs for (`_owner`)
    <root>/<tenant digest>/batches/<batch id>.output.jsonl / .errors.jsonl   each line's result, appended once
    <root>/<tenant digest>/batches/<batch id>.lock  held (flock) by the router running the batch

Objects are written whole to a temporary file and renamed (a crash leaves the old or the new one); a
result line is appended and flushed before the line counts as done, and a torn last line (a crash
mid-append) is cut off when the batch resumes, so a restart neither loses nor repeats a recorded line."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from oculis_router.batch.check import BATCH_ID, FILE_ID

OWNER = "_owner"  # the batch's private record of who it runs for; never shown to a client


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


class Store:
    """The directory store: one router replica (or several on one shared filesystem with working flock).
    With `server.redis_url` set the router uses redis_store.RedisStore instead (shared, per-line claims)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.where = f"the directory {root}"

    def check(self) -> None:
        """Nothing to reach: a directory that cannot be written fails loudly when written."""

    # ---- layout -------------------------------------------------------------------------------------
    def home(self, tenant: str) -> Path:
        return self.root / hashlib.sha256(tenant.encode()).hexdigest()[:32]

    def _file(self, tenant: str, file_id: str, ext: str) -> Path | None:
        return self.home(tenant) / "files" / f"{file_id}.{ext}" if FILE_ID.match(file_id) else None

    def _batch(self, tenant: str, batch_id: str, ext: str) -> Path | None:
        return self.home(tenant) / "batches" / f"{batch_id}.{ext}" if BATCH_ID.match(batch_id) else None

    # ---- files --------------------------------------------------------------------------------------
    def put_file(self, tenant: str, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        file_id = new_id("file-")
        meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}
        path = self._file(tenant, file_id, "data")
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, data)
        _write(path.with_suffix(".json"), json.dumps(meta).encode())
        return meta

    def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        path = self._file(tenant, file_id, "json")
        return _read(path) if path is not None else None

    def content_path(self, tenant: str, file_id: str) -> Path | None:
        path = self._file(tenant, file_id, "data")
        return path if path is not None and path.exists() and self.file(tenant, file_id) is not None else None

    def file_bytes(self, tenant: str, file_id: str) -> bytes | None:
        path = self.content_path(tenant, file_id)
        return path.read_bytes() if path is not None else None

    def files(self, tenant: str) -> list[dict[str, Any]]:
        folder = self.home(tenant) / "files"
        found = [m for p in folder.glob("file-*.json") if (m := _read(p)) is not None] if folder.exists() else []
        return sorted(found, key=lambda m: (m["created_at"], m["id"]), reverse=True)

    def delete_file(self, tenant: str, file_id: str) -> bool:
        meta = self._file(tenant, file_id, "json")
        if meta is None or not meta.exists():
            return False
        meta.unlink()
        with contextlib.suppress(FileNotFoundError):
            meta.with_suffix(".data").unlink()
        return True

    # ---- batches ------------------------------------------------------------------------------------
    def save_batch(self, tenant: str, batch: dict[str, Any]) -> None:
        self.write_batch(tenant, batch["id"], json.dumps(batch).encode())

    def write_batch(self, tenant: str, batch_id: str, data: bytes) -> None:
        """A batch object already serialised (so a thread can write it while the batch changes)."""
        path = self._batch(tenant, batch_id, "json")
        assert path is not None
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(path, data)

    def batch(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        path = self._batch(tenant, batch_id, "json")
        return _read(path) if path is not None else None

    def batches(self, tenant: str) -> list[dict[str, Any]]:
        folder = self.home(tenant) / "batches"
        found = [b for p in folder.glob("batch_*.json") if (b := _read(p)) is not None] if folder.exists() else []
        return sorted(found, key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def open_batches(self) -> Iterator[dict[str, Any]]:
        """Every batch of every tenant not yet in a final state (a restarted router resumes them)."""
        if not self.root.exists():
            return
        for path in self.root.glob("*/batches/batch_*.json"):
            b = _read(path)
            if b is not None and b.get("status") in ("validating", "in_progress", "finalizing", "cancelling"):
                yield b

    def results(self, tenant: str, batch_id: str, kind: str) -> Path:
        path = self._batch(tenant, batch_id, f"{kind}.jsonl")
        assert path is not None
        return path

    def put_input(self, tenant: str, batch_id: str, data: bytes) -> None:
        self.results(tenant, batch_id, "input").parent.mkdir(parents=True, exist_ok=True)
        _write(self.results(tenant, batch_id, "input"), data)

    def input_bytes(self, tenant: str, batch_id: str) -> bytes:
        return self.results(tenant, batch_id, "input").read_bytes()

    def result_bytes(self, tenant: str, batch_id: str, kind: str) -> bytes:
        path = self.results(tenant, batch_id, kind)
        return path.read_bytes() if path.exists() else b""

    def appender(self, tenant: str, batch_id: str) -> Appender:
        return Appender(self, tenant, batch_id)

    # one replica runs a batch here (its flock): every line is its own, and it alone finishes the batch
    def beat(self) -> None:
        pass

    def claim(self, tenant: str, batch_id: str, custom_id: str) -> bool:
        return True

    def finisher(self, tenant: str, batch_id: str) -> bool:
        return True

    def in_flight(self, tenant: str, batch_id: str) -> int:
        return 0  # this replica's lines are all answered when it asks

    def recorded(self, tenant: str, batch_id: str) -> tuple[set[str], int, int]:
        """The custom_ids whose results are written, and how many of them succeeded and failed; a torn
        last line (a crash while it was appended) is cut off first: that request runs again."""
        done: set[str] = set()
        counts = []
        for kind in ("output", "errors"):
            path = self.results(tenant, batch_id, kind)
            n = 0
            if path.exists():
                _cut_torn_tail(path)
                for raw in path.read_bytes().splitlines():
                    done.add(json.loads(raw)["custom_id"])
                    n += 1
            counts.append(n)
        return done, counts[0], counts[1]

    def lock(self, tenant: str, batch_id: str) -> IO[bytes] | None:
        """An exclusive hold on running the batch (another router replica on the same directory skips it),
        or None when someone else holds it. Released when the returned file is closed."""
        path = self._batch(tenant, batch_id, "lock")
        assert path is not None
        f = path.open("ab")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return None
        return f


class Appender:
    """One batch's result files, open for appending; each line flushed and synced before it counts
    (`write` may run in worker threads: one line at a time)."""

    def __init__(self, store: Store, tenant: str, batch_id: str) -> None:
        self.files = {k: store.results(tenant, batch_id, k).open("ab") for k in ("output", "errors")}
        self.lock = threading.Lock()

    def write(self, kind: str, record: dict[str, Any]) -> bool:
        line = json.dumps(record).encode() + b"\n"
        with self.lock:
            f = self.files[kind]
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return True

    def close(self) -> None:
        for f in self.files.values():
            f.close()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _cut_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
