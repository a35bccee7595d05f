"""Leader election's pure parts: settings from the environment (one-line errors naming the
variable), the client library's timing rule, the renew deadline that stops a leader, and what the
health endpoints report for a leader and a follower."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from oculis_operator import leader


def test_settings_default_to_client_go_timings_and_all_namespaces() -> None:
    s = leader.settings_from({"POD_NAME": "op-1", "POD_NAMESPACE": "oculis"}, [])
    assert (s.lease_name, s.lease_namespace, s.pod_name, s.health_port) == ("oculis-operator", "oculis", "op-1", 8080)
    assert s.timing == leader.Timing(12, 8, 2) and s.namespaces == []
    assert s.identity.startswith("op-1_")
    # Two containers of one pod name (a restart) are two identities: neither inherits the other's Lease.
    assert leader.settings_from({"POD_NAME": "op-1"}, []).identity != s.identity
    assert leader.settings_from({}, ["--namespace", "a", "--namespace", "b"]).namespaces == ["a", "b"]


@pytest.mark.parametrize(("env", "says"), [
    ({"OCULIS_LEASE_DURATION": "10", "OCULIS_LEASE_RENEW_DEADLINE": "10"},
     "OCULIS_LEASE_DURATION (10) must be above OCULIS_LEASE_RENEW_DEADLINE (10)"),
    ({"OCULIS_LEASE_RETRY_PERIOD": "9"}, "must be above 1.2 x OCULIS_LEASE_RETRY_PERIOD (9)"),
    ({"OCULIS_LEASE_DURATION": "fast"}, "OCULIS_LEASE_DURATION='fast' is not a number of seconds"),
    ({"OCULIS_LEASE_RETRY_PERIOD": "0.5"}, "at least 1 s"),
    ({"OCULIS_HEALTH_PORT": "http"}, "OCULIS_HEALTH_PORT='http' is not a port"),
])
def test_bad_settings_are_one_line_naming_the_variable(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        leader.settings_from(env, [])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_bad_settings_exit_2_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OCULIS_LEASE_DURATION", "5")
    assert leader.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "OCULIS_LEASE_DURATION (5)" in err


def test_a_leader_past_its_renew_deadline_must_stop() -> None:
    state = leader.State("me", leading=True, last_renewal=100.0)
    assert not leader.lost_lease(state, 109.9, 10)
    assert leader.lost_lease(state, 110.1, 10)
    assert not leader.lost_lease(leader.State("me", leading=False, last_renewal=0.0), 1e9, 10)  # a follower waits


def health(state: leader.State) -> dict[str, tuple[int, dict[str, object]]]:
    async def go() -> dict[str, tuple[int, dict[str, object]]]:
        async with TestClient(TestServer(leader.health_app(state))) as client:
            out = {}
            for path in ("/healthz", "/readyz", "/leader"):
                resp = await client.get(path)
                out[path] = (resp.status, await resp.json())
            return out

    return asyncio.run(go())


def test_readiness_reports_leadership() -> None:
    follower = health(leader.State("b", holder="a"))
    assert follower["/healthz"][0] == 200 and follower["/readyz"][0] == 200 and follower["/leader"][0] == 503
    assert follower["/readyz"][1] == {"leader": False, "identity": "b", "holder": "a", "reconciling": False}
    starting = health(leader.State("a", leading=True, holder="a"))  # leads, kopf not up yet
    assert starting["/readyz"][0] == 503 and starting["/leader"][0] == 503
    leading = health(leader.State("a", leading=True, kopf_ready=True, holder="a"))
    assert leading["/readyz"][0] == 200 and leading["/leader"][0] == 200
    assert leading["/readyz"][1]["reconciling"] is True
    stopping = health(leader.State("a", election_alive=False))
    assert stopping["/healthz"][0] == 503 and stopping["/readyz"][0] == 503


def test_the_default_lease_duration_is_one_the_lease_lock_can_write() -> None:
    # The library writes str(lease_duration) and reads it back with int(): a float "12.0" broke every
    # acquisition (the candidate exited at once).
    from kubernetes.aio.leaderelection.leaderelectionrecord import LeaderElectionRecord

    async def go() -> None:
        from kubernetes.aio import client as aclient

        async with aclient.ApiClient() as api:
            lock = leader.WatchedLease("l", "ns", "me", api, leader.State("me"))

            async def nothing() -> None:
                return None

            config = leader.election_config(leader.Timing(), lock, nothing, nothing)
            now = "2026-12-01 08:00:00.000000"
            spec = lock.update_lease(LeaderElectionRecord("me", str(config.lease_duration), now, now))
            assert spec.lease_duration_seconds == 12 and spec.holder_identity == "me"

    asyncio.run(go())
