"""The chart's operator ClusterRole allows every call the operator's Kube makes: a canary's Deployment
and Service are deleted when it is promoted, rolled back or superseded (kube.delete_canary), which a
role without `delete` refuses with 403, leaving a canary taking traffic. Rendered with `helm template`
(no cluster needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml
from e2e_support import CLUSTER

CHART = Path(__file__).resolve().parents[2] / "charts" / "oculis"


def operator_rules() -> list[dict[str, Any]]:
    bin_dir = Path(subprocess.run([str(CLUSTER), "bin-dir"], capture_output=True, text=True,
                                  check=True).stdout.strip().splitlines()[-1])
    out = subprocess.run([str(bin_dir / "helm"), "template", "oculis", str(CHART), "-n", "oculis-system"],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    role = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "ClusterRole"
                and d["metadata"]["name"].endswith("-operator"))
    rules: list[dict[str, Any]] = role["rules"]
    return rules


def allowed(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


def test_the_operator_role_can_delete_the_canary_deployment_and_service() -> None:
    rules = operator_rules()
    assert "delete" in allowed(rules, "apps", "deployments")
    assert "delete" in allowed(rules, "", "services")
    assert allowed(rules, "", "secrets") == {"get"}  # still least privilege where it matters
