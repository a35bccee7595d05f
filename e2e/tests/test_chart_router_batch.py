"""The chart's router.batch and router.flowControl reach the router as its server section: the rendered
OCULIS_SERVER_SETTINGS is read by the router's own parser and schema (state.server_settings), the batch
state goes to Redis when router.redis is set (no volume) and to a writable volume otherwise (one replica,
or a claim), and bad values are refused at `helm template` (values.schema.json, the replicas check).
Rendered with `helm template` (no cluster needed)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from e2e_support import CLUSTER

from oculis import parse_config
from oculis_router.state import server_settings, with_server_settings

CHART = Path(__file__).resolve().parents[2] / "charts" / "oculis"


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(subprocess.run([str(CLUSTER), "bin-dir"], capture_output=True, text=True,
                                  check=True).stdout.strip().splitlines()[-1])
    return subprocess.run([str(bin_dir / "helm"), "template", "oculis", str(CHART), "-n", "oculis-system", *args],
                          capture_output=True, text=True, check=False)


def router_pod(*args: str) -> dict[str, Any]:
    out = helm_template(*args)
    assert out.returncode == 0, out.stderr
    deploy = next(d for d in yaml.safe_load_all(out.stdout)
                  if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-router"))
    spec: dict[str, Any] = deploy["spec"]["template"]["spec"]
    return spec


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["containers"][0].get("env", [])}


def test_batch_and_flow_control_values_reach_the_routers_server_section() -> None:
    pod = router_pod("--set", "router.batch.enabled=true", "--set", "router.batch.concurrency=4",
                     "--set", "router.redis.url=redis://oculis-redis:6379/0",
                     "--set", "router.flowControl.enabled=true", "--set", "router.flowControl.seatsPerReplica=8")
    env = env_of(pod)
    # the operator renders no server section
    config = parse_config(yaml.safe_dump({"oculis": {"upstreams": [], "routes": []}}), "rendered")
    server = with_server_settings(config, server_settings(env["OCULIS_SERVER_SETTINGS"])).server
    assert server.batch.enabled and server.batch.concurrency == 4
    assert server.flow_control.enabled and server.flow_control.seats_per_replica == 8
    assert env["OCULIS_REDIS_URL"] == "redis://oculis-redis:6379/0"  # the batch state is in this Redis
    assert not any(v["name"] == "batch-state" for v in pod["volumes"])  # no volume: replicas share Redis


def test_without_redis_the_batch_directory_is_a_writable_volume_for_one_replica() -> None:
    pod = router_pod("--set", "router.batch.enabled=true", "--set", "router.replicas=1")
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["batch-state"]["mountPath"] == "/var/lib/oculis/batch"
    assert not mounts["batch-state"].get("readOnly")
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
    assert {"name": "batch-state", "emptyDir": {}} in pod["volumes"]
    claimed = router_pod("--set", "router.batch.enabled=true", "--set", "router.batch.persistentVolumeClaim=batches")
    assert {"name": "batch-state", "persistentVolumeClaim": {"claimName": "batches"}} in claimed["volumes"]
    assert "OCULIS_SERVER_SETTINGS" not in env_of(router_pod())  # off: nothing passed


def test_bad_batch_values_are_refused_naming_them() -> None:
    many = helm_template("--set", "router.batch.enabled=true")  # 2 replicas, each on its own emptyDir
    assert many.returncode != 0 and "router.batch" in many.stderr and "router.redis" in many.stderr
    bad = helm_template("--set", "router.batch.concurrency=0")
    assert bad.returncode != 0 and "concurrency" in bad.stderr
    json.loads((CHART / "values.schema.json").read_text())
