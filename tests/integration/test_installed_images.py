"""The router and the operator as their images install them (Dockerfile.runtime, Dockerfile.operator):
`pip install .[router]` / `.[operator]` from the same folders into a clean venv, run from outside the
checkout. Catches what an editable checkout hides: package data or subpackages missing from the
wheel, a dependency missing from an extra, and kopf or the Kubernetes client creeping into the router."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
from fake_upstreams import free_port
from time_scale import Deadline

ROOT = Path(__file__).resolve().parents[2]
# Exactly what Dockerfile.runtime and Dockerfile.operator copy into their build stages.
ROUTER_IMAGE = ["pyproject.toml", "README.md", "crds/oculis", "runtime", "cli", "measure", "operator/oculis_operator"]
OPERATOR_IMAGE = ["pyproject.toml", "README.md", "crds/oculis", "operator", "runtime", "cli", "measure"]


def install(tmp_path: Path, extra: str, copied: list[str]) -> Path:
    """`pip install .[extra]` of the folders an image copies, into a clean venv; the sources are then
    removed, so nothing can come from the checkout."""
    src = tmp_path / "src"
    for rel in copied:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_dir():
            shutil.copytree(ROOT / rel, src / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / rel, src / rel)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"{src}[{extra}]"],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    shutil.rmtree(src)
    return venv


def test_installed_router_scores_and_serves_without_kopf(tmp_path: Path) -> None:
    venv = install(tmp_path, "router", ROUTER_IMAGE)
    oculis = str(venv / "bin" / "oculis")
    config = ROOT / "examples" / "oculis-config.yaml"

    score = subprocess.run([oculis, "route", "score", "--config", str(config), "--route", "adaptive"],
                           input='{"prompt": "hi"}\n', capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert score.returncode == 0 and '"tier": "simple"' in score.stdout, score.stderr

    no_kopf = subprocess.run([str(venv / "bin" / "python"), "-c", "import kopf"], capture_output=True, cwd=tmp_path)
    no_k8s = subprocess.run([str(venv / "bin" / "python"), "-c", "import kubernetes"], capture_output=True,
                            cwd=tmp_path)
    assert no_kopf.returncode != 0 and no_k8s.returncode != 0
    # `oculis epp` (the Gateway's endpoint picker) ships in the router image: its gRPC and Envoy protobufs too
    epp = subprocess.run([oculis, "epp", "--config", str(config), "--upstream", "openai-gpt4o"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=60)
    assert epp.returncode == 2 and "external provider" in epp.stderr, epp.stderr
    grpc_ok = subprocess.run([str(venv / "bin" / "python"), "-c", "import oculis_router.epp.server"],
                             capture_output=True, text=True, cwd=tmp_path)
    assert grpc_ok.returncode == 0, grpc_ok.stderr
    deps = subprocess.run([oculis, "status", "--check-deps", "--require", "router"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert deps.returncode == 0 and "operator  the Kubernetes operator      missing kopf" in deps.stdout, deps.stdout

    port = free_port()
    proc = subprocess.Popen([oculis, "serve", "--config", str(config), "--port", str(port), "--metrics-port", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = Deadline(30)
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert not deadline.expired(), "the installed router never became ready"
            time.sleep(0.2)
        ids = [m["id"] for m in httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]]
        assert "adaptive" in ids
    finally:
        proc.terminate()
        proc.wait(30)


def test_installed_operator_loads_its_handlers_and_plans(tmp_path: Path) -> None:
    venv = install(tmp_path, "operator", OPERATOR_IMAGE)
    assert (venv / "bin" / "kopf").exists()  # the image's entrypoint
    load = subprocess.run([str(venv / "bin" / "python"), "-c", "import oculis_operator.handlers as h; print(h.GROUP)"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert load.returncode == 0 and "oculis.dev" in load.stdout, load.stderr
    plan = subprocess.run([str(venv / "bin" / "oculis"), "capacity", "plan", "--model",
                           "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "H100-80GB"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert plan.returncode == 0 and "FITS" in plan.stdout, plan.stderr
    deps = subprocess.run([str(venv / "bin" / "oculis"), "status", "--require", "operator"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    assert deps.returncode == 0, deps.stdout
