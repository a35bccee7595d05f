"""The Batch API's state in Redis (at `server.redis_url`), shared by every router replica: a restart or a
second replica loses no line and records none twice.

    oculis:batch:<tenant digest>:file:<file id>            the file object (JSON)
    oculis:batch:<tenant digest>:filedata:<file id>        its bytes (bounded by server.batch.max_file_bytes)
    oculis:batch:<tenant digest>:files                     sorted set of the tenant's file ids (by creation)
    oculis:batch:<tenant digest>:batch:<batch id>          the batch object (JSON, with its `_owner`)
    oculis:batch:<tenant digest>:batches                   sorted set of the tenant's batch ids
    oculis:batch:<tenant digest>:b:<batch id>:input        the batch's own copy of its input
    oculis:batch:<tenant digest>:b:<batch id>:output / :errors   hash custom_id -> result line
    oculis:batch:<tenant digest>:b:<batch id>:claims       hash custom_id -> the replica that runs it
    oculis:batch:<tenant digest>:b:<batch id>:cancel       set once the batch is cancelled
    oculis:batch:<tenant digest>:b:<batch id>:final        held by the replica that writes the output files
    oculis:batch:open                                      set of open batch keys (every replica resumes them)
    oculis:batch:alive:<replica>                           a live replica's lease (expires LEASE_S after its last beat)

Dispatch is claimed per line by a Lua script (atomic): a line no one holds, or held by a replica whose
lease expired (it died mid-line), is taken; a line with a result is never taken again. A result is
recorded only if the line has none yet (HSETNX across both hashes, in Lua): each line's result once.
Counts shown are the sizes of the result hashes, so replicas never overwrite each other's counts; a batch
in a final state is never overwritten by a replica's older snapshot.
Durability is Redis's own: run it with AOF (appendonly yes) or RDB snapshots, or a Redis restart loses
the batches."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

from oculis_router.batch.check import BATCH_ID, FILE_ID
from oculis_router.batch.store import new_id

LEASE_S = 10  # a replica that has not beaten for this long is dead: its claimed lines run again
TIMEOUT_S = 2.0
PREFIX = "oculis:batch:"
OPEN = PREFIX + "open"
FINAL = ("completed", "failed", "expired", "cancelled")

CLAIM_LUA = """
-- KEYS: claims, output, errors. ARGV: custom_id, me, alive-key prefix.
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[3], ARGV[1]) == 1 then
  return 0
end
local holder = redis.call('HGET', KEYS[1], ARGV[1])
if holder and holder ~= ARGV[2] and redis.call('EXISTS', ARGV[3] .. holder) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

RECORD_LUA = """
-- KEYS: the result hash to write, the other one. ARGV: custom_id, line. Once per custom_id.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 or redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

SAVE_LUA = """
-- KEYS: the batch key. ARGV: the batch JSON, its status. A final batch is never overwritten.
local old = redis.call('GET', KEYS[1])
if old then
  local s = cjson.decode(old)['status']
  if (s == 'completed' or s == 'failed' or s == 'expired' or s == 'cancelled') and s ~= ARGV[2] then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
"""


def safe_url(url: str) -> str:
    """The URL without its password (never logged or answered)."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.hostname}:{p.port or 6379}{p.path}"


class RedisStore:
    def __init__(self, url: str) -> None:
        import redis

        self.url = url
        self.where = f"Redis at {safe_url(url)}"
        self.r: Any = redis.Redis.from_url(url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S)
        self.replica = secrets.token_hex(8)
        self._claim = self.r.register_script(CLAIM_LUA)
        self._record = self.r.register_script(RECORD_LUA)
        self._save = self.r.register_script(SAVE_LUA)

    # ---- layout -------------------------------------------------------------------------------------
    @staticmethod
    def home(tenant: str) -> str:
        return PREFIX + hashlib.sha256(tenant.encode()).hexdigest()[:32]

    def _b(self, tenant: str, batch_id: str, part: str) -> str:
        return f"{self.home(tenant)}:b:{batch_id}:{part}"

    def check(self) -> None:
        """Raises if Redis cannot be reached (a batch is not accepted that nobody could run)."""
        self.r.ping()

    # ---- files --------------------------------------------------------------------------------------
    def put_file(self, tenant: str, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
        file_id = new_id("file-")
        meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}
        h = self.home(tenant)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(f"{h}:filedata:{file_id}", data)
        pipe.set(f"{h}:file:{file_id}", json.dumps(meta))
        pipe.zadd(f"{h}:files", {file_id: time.time()})
        pipe.execute()
        return meta

    def file(self, tenant: str, file_id: str) -> dict[str, Any] | None:
        if not FILE_ID.match(file_id):
            return None
        return _doc(self.r.get(f"{self.home(tenant)}:file:{file_id}"))

    def file_bytes(self, tenant: str, file_id: str) -> bytes | None:
        if not FILE_ID.match(file_id):
            return None
        data = self.r.get(f"{self.home(tenant)}:filedata:{file_id}")
        return bytes(data) if data is not None else None

    def files(self, tenant: str) -> list[dict[str, Any]]:
        h = self.home(tenant)
        ids = [i.decode() for i in self.r.zrange(f"{h}:files", 0, -1)]
        found = [m for raw in (self.r.mget([f"{h}:file:{i}" for i in ids]) if ids else []) if (m := _doc(raw))]
        return sorted(found, key=lambda m: (m["created_at"], m["id"]), reverse=True)

    def delete_file(self, tenant: str, file_id: str) -> bool:
        if not FILE_ID.match(file_id):
            return False
        h = self.home(tenant)
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(f"{h}:file:{file_id}", f"{h}:filedata:{file_id}")
        pipe.zrem(f"{h}:files", file_id)
        return bool(pipe.execute()[0])

    # ---- batches ------------------------------------------------------------------------------------
    def save_batch(self, tenant: str, batch: dict[str, Any]) -> None:
        self.write_batch(tenant, batch["id"], json.dumps(batch).encode())

    def write_batch(self, tenant: str, batch_id: str, data: bytes) -> None:
        status = json.loads(data)["status"]
        key = f"{self.home(tenant)}:batch:{batch_id}"
        self._save(keys=[key], args=[data, status])
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(f"{self.home(tenant)}:batches", {batch_id: json.loads(data)["created_at"]}, nx=True)
        if status == "cancelling":
            pipe.set(self._b(tenant, batch_id, "cancel"), 1)
        if status in FINAL:
            pipe.srem(OPEN, f"{tenant_digest(tenant)}:{batch_id}")
        else:
            pipe.sadd(OPEN, f"{tenant_digest(tenant)}:{batch_id}")
        pipe.execute()

    def batch(self, tenant: str, batch_id: str) -> dict[str, Any] | None:
        if not BATCH_ID.match(batch_id):
            return None
        return self._overlay(tenant, _doc(self.r.get(f"{self.home(tenant)}:batch:{batch_id}")))

    def _overlay(self, tenant: str, b: dict[str, Any] | None) -> dict[str, Any] | None:
        """The counts every replica's results make, and a cancel from any replica."""
        if b is None:
            return None
        pipe = self.r.pipeline(transaction=False)
        pipe.hlen(self._b(tenant, b["id"], "output"))
        pipe.hlen(self._b(tenant, b["id"], "errors"))
        pipe.exists(self._b(tenant, b["id"], "cancel"))
        ok, failed, cancel = pipe.execute()
        b["request_counts"] = {**b["request_counts"], "completed": ok, "failed": failed}
        if cancel and b["status"] not in FINAL and b["status"] != "cancelling":
            b["status"] = "cancelling"
        return b

    def batches(self, tenant: str) -> list[dict[str, Any]]:
        h = self.home(tenant)
        ids = [i.decode() for i in self.r.zrange(f"{h}:batches", 0, -1)]
        raws = self.r.mget([f"{h}:batch:{i}" for i in ids]) if ids else []
        found = [b for raw in raws if (b := self._overlay(tenant, _doc(raw)))]
        return sorted(found, key=lambda b: (b["created_at"], b["id"]), reverse=True)

    def open_batches(self) -> list[dict[str, Any]]:
        found = []
        for member in self.r.smembers(OPEN):
            digest, batch_id = member.decode().split(":", 1)
            b = _doc(self.r.get(f"{PREFIX}{digest}:batch:{batch_id}"))
            if b is not None and b["status"] not in FINAL:
                found.append(b)
        return found

    def put_input(self, tenant: str, batch_id: str, data: bytes) -> None:
        self.r.set(self._b(tenant, batch_id, "input"), data)

    def input_bytes(self, tenant: str, batch_id: str) -> bytes:
        data = self.r.get(self._b(tenant, batch_id, "input"))
        if data is None:
            raise OSError(f"batch {batch_id}: its input is gone from {self.where}")
        return bytes(data)

    def recorded(self, tenant: str, batch_id: str) -> tuple[set[str], int, int]:
        ok = [k.decode() for k in self.r.hkeys(self._b(tenant, batch_id, "output"))]
        failed = [k.decode() for k in self.r.hkeys(self._b(tenant, batch_id, "errors"))]
        return set(ok) | set(failed), len(ok), len(failed)

    def result_bytes(self, tenant: str, batch_id: str, kind: str) -> bytes:
        return b"".join(bytes(v) + b"\n" for v in self.r.hvals(self._b(tenant, batch_id, kind)))

    # ---- running ------------------------------------------------------------------------------------
    def beat(self) -> None:
        """This replica is alive: the lines it claimed stay its own for LEASE_S more."""
        self.r.set(PREFIX + "alive:" + self.replica, 1, ex=LEASE_S)

    def claim(self, tenant: str, batch_id: str, custom_id: str) -> bool:
        keys = [self._b(tenant, batch_id, p) for p in ("claims", "output", "errors")]
        return bool(self._claim(keys=keys, args=[custom_id, self.replica, PREFIX + "alive:"]))

    def record(self, tenant: str, batch_id: str, kind: str, record: dict[str, Any]) -> bool:
        other = "errors" if kind == "output" else "output"
        keys = [self._b(tenant, batch_id, kind), self._b(tenant, batch_id, other)]
        return bool(self._record(keys=keys, args=[record["custom_id"], json.dumps(record)]))

    def in_flight(self, tenant: str, batch_id: str) -> int:
        """Lines a live replica has claimed and not yet recorded (a cancelled batch is finished once these
        are, so its output file holds every line its counts do)."""
        claims = {k.decode(): v.decode() for k, v in self.r.hgetall(self._b(tenant, batch_id, "claims")).items()}
        done = self.recorded(tenant, batch_id)[0]
        holders = sorted({h for c, h in claims.items() if c not in done})
        alive = dict(zip(holders, self.r.mget([PREFIX + "alive:" + h for h in holders]), strict=True)) \
            if holders else {}
        return sum(1 for c, h in claims.items() if c not in done and alive.get(h) is not None)

    def appender(self, tenant: str, batch_id: str) -> RedisAppender:
        return RedisAppender(self, tenant, batch_id)

    def lock(self, tenant: str, batch_id: str) -> RedisAppender:
        """No batch-wide hold here: replicas share a batch line by line (claim); a thing to close."""
        return RedisAppender(self, tenant, batch_id)

    def finisher(self, tenant: str, batch_id: str) -> bool:
        """Whether this replica writes the batch's output files (one does; another takes over after LEASE_S
        should it die doing so)."""
        return bool(self.r.set(self._b(tenant, batch_id, "final"), self.replica, nx=True, ex=LEASE_S * 6))


class RedisAppender:
    def __init__(self, store: RedisStore, tenant: str, batch_id: str) -> None:
        self.store, self.tenant, self.batch_id = store, tenant, batch_id

    def write(self, kind: str, record: dict[str, Any]) -> bool:
        """False when the line already had a result (another replica's, recorded first)."""
        return self.store.record(self.tenant, self.batch_id, kind, record)

    def close(self) -> None:
        pass


def tenant_digest(tenant: str) -> str:
    return hashlib.sha256(tenant.encode()).hexdigest()[:32]


def _doc(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None
