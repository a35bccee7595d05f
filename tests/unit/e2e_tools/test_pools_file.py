"""The sandbox's node-pool file: good pools become labelled, tainted GPU nodes; bad ones name the field."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("localcluster", ROOT / "e2e" / "localcluster.py")
assert spec and spec.loader
lc = importlib.util.module_from_spec(spec)
sys.modules["localcluster"] = lc
spec.loader.exec_module(lc)


def test_default_pools_are_two_a100_and_two_h100_nodes_of_8_gpus() -> None:
    nodes = lc.node_manifests(lc.load_pools(ROOT / "e2e" / "pools.yaml"))
    products = sorted(n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes)
    assert products == ["NVIDIA-A100-SXM4-80GB"] * 2 + ["NVIDIA-H100-80GB-HBM3"] * 2
    h100 = next(n for n in nodes if n["metadata"]["name"] == "h100-pool-0")
    assert h100["metadata"]["labels"]["nvidia.com/gpu.memory"] == "81559"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.family"] == "hopper"
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert h100["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]


def test_pool_by_short_name(tmp_path: Path) -> None:
    f = tmp_path / "p.yaml"
    f.write_text("pools: [{name: l40s, product: L40S-48GB, nodes: 1, gpusPerNode: 4}]")
    (node,) = lc.node_manifests(lc.load_pools(f))
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    assert node["metadata"]["labels"]["nvidia.com/gpu.count"] == "4"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pools: []", "`pools` must be a non-empty list"),
        ("pools: [{name: x, product: V100}]", "pools[0].product: unknown GPU product 'V100'"),
        ("pools: [{name: x, product: H100-80GB, nodes: 0}]", "pools[0].nodes=0 must be a positive integer"),
        ("pools: [{name: Bad_Name, product: H100-80GB}]", "pools[0].name='Bad_Name' must be a lowercase"),
        ("pools: [{name: x, product: H100-80GB, gpusPerNode: two}]", "pools[0].gpusPerNode='two'"),
        ("pools: {", "cannot read pools file"),
    ],
)
def test_bad_pools_file_names_the_field(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(lc.ClusterError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        lc.load_pools(f)
