"""The Batch API's Redis store (runtime/oculis_router/batch/redis_store.py) on a real redis-server, two
replicas as two store objects: a line is claimed by one replica at a time, taken over only once its holder's
lease lapses, never once it has a result; a result is recorded once; a final batch is never overwritten by an
older snapshot; counts and a cancel are the same from every replica."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_upstreams import free_port
from time_scale import Deadline

from oculis_router.batch.redis_store import PREFIX, RedisStore

pytestmark = pytest.mark.skipif(subprocess.run(["which", "redis-server"], capture_output=True).returncode != 0,
                                reason="redis-server is not installed (apt-get install redis-server)")


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = Deadline(30)
        while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True,
                             text=True).stdout.strip() != "PONG":
            assert not deadline.expired(), "redis-server did not start"
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.kill()
        proc.wait(timeout=15)


B1, B2 = "batch_89abcdef0123456789abcdef", "batch_0123456789abcdef01234567"


def record(custom_id: str, status: int = 200) -> dict[str, object]:
    return {"id": "batch_req_1", "custom_id": custom_id, "response": {"status_code": status, "body": {}},
            "error": None}


def test_a_line_is_claimed_once_taken_over_only_from_a_dead_replica_and_recorded_once(url: str) -> None:
    a, b = RedisStore(url), RedisStore(url)
    a.beat()
    b.beat()
    assert a.claim("t", B1, "x")
    assert not b.claim("t", B1, "x")  # a is alive and holds it
    assert a.claim("t", B1, "x")  # its own again (a resumed loop)
    assert b.in_flight("t", B1) == 1
    a.r.delete(PREFIX + "alive:" + a.replica)  # a's lease lapses (it died)
    assert b.in_flight("t", B1) == 0
    assert b.claim("t", B1, "x")
    assert b.appender("t", B1).write("output", record("x"))
    assert not a.appender("t", B1).write("errors", record("x", 500))  # a late answer: not a second result
    assert not a.claim("t", B1, "x") and not b.claim("t", B1, "x")  # answered: never again
    assert a.recorded("t", B1) == ({"x"}, 1, 0)
    assert [json.loads(x)["custom_id"] for x in a.result_bytes("t", B1, "output").splitlines()] == ["x"]


def test_a_final_batch_is_never_overwritten_and_counts_and_cancel_are_shared(url: str) -> None:
    a, b = RedisStore(url), RedisStore(url)
    batch = {"id": B2, "status": "in_progress", "created_at": 1,
             "request_counts": {"total": 2, "completed": 0, "failed": 0}}
    a.save_batch("t", batch)
    assert [x["id"] for x in b.open_batches()] == [B2]
    b.appender("t", B2).write("output", record("y"))
    assert a.batch("t", B2)["request_counts"] == {"total": 2, "completed": 1, "failed": 0}  # type: ignore[index]
    b.save_batch("t", {**batch, "status": "cancelling"})
    a.save_batch("t", batch)  # a's older snapshot: the cancel stands
    assert a.batch("t", B2)["status"] == "cancelling"  # type: ignore[index]
    a.save_batch("t", {**batch, "status": "cancelled"})
    b.save_batch("t", {**batch, "status": "in_progress"})
    assert b.batch("t", B2)["status"] == "cancelled"  # type: ignore[index]
    assert b.open_batches() == [] and b.batch("u", B2) is None  # closed; no other tenant's
    assert a.finisher("t", B2) and not b.finisher("t", B2)
