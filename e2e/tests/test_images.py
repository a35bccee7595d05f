"""The operator and router images as users install them (`make images`: build/images/*.oci.tar), run as
images: each archive is unpacked with umoci and its own ENTRYPOINT + CMD, from the image config, runs in
a chroot of its root filesystem as uid 65532, the root mounted read-only (a private mount namespace:
tmpfs on /tmp and /dev, /proc, the config mounted read-only at /etc/oculis, as a pod mounts it). The
chroot shares this machine's network namespace, so everything talks over 127.0.0.1.

`podman run` cannot start containers on these machines (crun cannot set rlimits or cgroups), hence the
chroot. Where the images are not built, the session builds them (images/build.sh, idempotent). A
machine that cannot build or chroot skips with why, and under CI=true fails with why."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2e_support import eventually
from kubernetes import client
from operator_fixture import OperatorProcess, free_port

pytestmark = [pytest.mark.images, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
IMAGES = Path(os.environ.get("OCULIS_IMAGES_DIR", ROOT / "build" / "images"))
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SITE = "opt/oculis/lib/python3.11/site-packages"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
# Uncompressed root filesystems, MiB. Both share a ~119 MiB base (bookworm minbase + python3 +
# ca-certificates; python:3.11-slim is ~125 MiB). The operator adds ~155 MiB, ~126 of it the Kubernetes
# client (a generated model per API, sync and asyncio); the router ~165 MiB, 73 of it numpy with its
# OpenBLAS and ~30 tokenizers with huggingface_hub (measured 274 and 286 MiB). The budgets leave room for
# one modest dependency (grpcio for the endpoint picker is ~20 MiB) and fail on a heavy one (torch, a
# second numeric stack) or on the simulator, bench extras or the other image's client creeping in.
BUDGET_MIB = {"oculis-operator": 300, "oculis-router": 340}


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"images: {why} (CI=true: this machine must run the images tier)", pytrace=False)
    pytest.skip(f"images: {why}")


def _cannot_chroot() -> str | None:
    """Why this machine cannot run an image's rootfs in a chroot with private mounts, or None."""
    if os.geteuid() != 0:
        return "running an image in a chroot with its own mounts needs root (run the tests as root)"
    for tool in ("unshare", "chroot", "mount", "umoci"):
        if not shutil.which(tool):
            return f"no `{tool}` on PATH (Debian: apt-get install {'umoci' if tool == 'umoci' else 'util-linux'})"
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "mount", "-t", "tmpfs", "tmpfs",
                            "/mnt"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"cannot make a private mount namespace (unshare --mount): {probe.stderr.strip()}"
    return None


@dataclass(frozen=True)
class Image:
    name: str
    archive: Path
    bundle: Path  # umoci's runtime bundle: rootfs/ and config.json
    archive_mib: float
    rootfs_mib: float

    @property
    def rootfs(self) -> Path:
        return self.bundle / "rootfs"

    @property
    def config(self) -> dict[str, Any]:
        cfg: dict[str, Any] = json.loads((self.bundle / "config.json").read_text())
        return cfg

    def site(self) -> Path:
        return self.rootfs / SITE


def _mib(path: Path) -> float:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True)
               .stdout.split()[0]) / 2**20


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    why = _cannot_chroot()
    if why:
        _unavailable(why)
    missing = [t for t in ("buildah", "mmdebstrap") if not shutil.which(t)]
    if missing and os.environ.get("CI") != "true":  # under CI the build script installs them
        _unavailable(f"no {' '.join(missing)} to build the images: apt-get install {' '.join(missing)}")
    build = subprocess.run([str(ROOT / "images" / "build.sh")], capture_output=True, text=True, check=False,
                           env={**os.environ, "PYTHON": str(Path(sys.executable))}, timeout=3000)
    print(build.stdout + build.stderr)
    assert build.returncode == 0, f"images/build.sh failed:\n{build.stdout}{build.stderr}"
    out: dict[str, Image] = {}
    for name in ("oculis-operator", "oculis-router"):
        archive = IMAGES / f"{name}.oci.tar"
        work = tmp_path_factory.mktemp(name)
        layout = work / "layout"
        layout.mkdir()
        subprocess.run(["tar", "-xf", str(archive), "-C", str(layout)], check=True)  # the OCI layout itself
        subprocess.run(["umoci", "unpack", "--image", f"{layout}:{VERSION}", str(work / "bundle")],
                       check=True, capture_output=True)
        img = Image(name, archive, work / "bundle", archive.stat().st_size / 2**20, _mib(work / "bundle" / "rootfs"))
        print(f"images: {name}: rootfs {img.rootfs_mib:.0f} MiB (budget {BUDGET_MIB[name]}), "
              f"archive {img.archive_mib:.0f} MiB")
        out[name] = img
    return out


@contextlib.contextmanager
def run_image(img: Image, args: list[str], env: dict[str, str], etc: Path, log: Path) -> Iterator[None]:
    """The image's process (`args`, the image config's own unless a test swaps a port) as its uid, in a
    chroot of its rootfs mounted read-only, with `etc` mounted read-only at /etc/oculis."""
    proc_cfg = img.config["process"]
    uid, gid = proc_cfg["user"]["uid"], proc_cfg["user"].get("gid", proc_cfg["user"]["uid"])
    root = img.rootfs
    (root / "etc" / "oculis").mkdir(exist_ok=True)  # the mount point, as a runtime creates it
    etc.chmod(0o755)
    for f in etc.iterdir():
        f.chmod(0o644)
    image_env = dict(e.split("=", 1) for e in proc_cfg["env"])
    # HOME as a container runtime sets it: the user's home in the image's /etc/passwd, else /
    homes = {int(f[2]): f[5] for f in (ln.split(":") for ln in (root / "etc" / "passwd").read_text().splitlines())
             if len(f) > 5}
    full_env = {"HOME": homes.get(uid, "/"), **image_env, **env}
    script = f"""set -e
R={shlex.quote(str(root))}
mount --bind "$R" "$R"
mount --bind -o ro {shlex.quote(str(etc))} "$R/etc/oculis"
mount -o remount,bind,ro {shlex.quote(str(etc))} "$R/etc/oculis"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$R/tmp"
mount -t proc -o nosuid,nodev,noexec proc "$R/proc"
mount -t tmpfs -o mode=755,nosuid tmpfs "$R/dev"
for d in null zero random urandom; do touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done
mount -o remount,bind,ro "$R"
cd "$R"
exec env -i {' '.join(shlex.quote(f'{k}={v}') for k, v in full_env.items())} \\
  {shutil.which('chroot')} --userspec={uid}:{gid} "$R" {' '.join(shlex.quote(a) for a in args)}
"""
    with log.open("wb") as out:
        proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


# ------------------------------------------------------------------------------------------- contents

def test_images_hold_what_each_plane_needs_and_nothing_else(images: dict[str, Image]) -> None:
    router, op = images["oculis-router"], images["oculis-operator"]
    for img in images.values():
        assert img.rootfs_mib < BUDGET_MIB[img.name], f"{img.name}: {img.rootfs_mib:.0f} MiB over its budget"
        cfg = img.config
        assert cfg["process"]["user"]["uid"] == 65532 and cfg["process"]["user"].get("gid") == 65532
        labels = cfg["annotations"]
        assert labels["org.opencontainers.image.version"] == VERSION
        assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        assert labels["org.opencontainers.image.source"].startswith("https://")
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            assert labels["org.opencontainers.image.revision"] == head.stdout.strip()
        site = img.site()
        assert (site / "oculis").is_dir() and (site / "oculis_cli").is_dir()
        # no simulator, no test code, no sources left from the build stage
        assert not (site / "oculis_sim").exists()
        ours = [p for p in site.iterdir() if p.name.startswith("oculis")]
        tests = [str(p) for d in ours for p in d.rglob("*") if p.name.startswith(("test_", "conftest")) or
                 p.name == "tests"]
        assert tests == [], tests
        assert not (img.rootfs / "src").exists()
        # no pip or compilers in the final stage
        pips = [str(p.relative_to(img.rootfs)) for p in img.rootfs.glob("**/site-packages/pip")]
        pips += [str(p.relative_to(img.rootfs)) for p in img.rootfs.glob("**/dist-packages/pip")]
        pips += [str(p.relative_to(img.rootfs)) for p in (img.rootfs / "usr/share/python-wheels").glob("pip*")]
        assert pips == [], pips
        for cc in ("gcc", "cc", "c++", "g++", "clang", "x86_64-linux-gnu-gcc-12"):
            for bindir in ("usr/bin", "usr/local/bin"):
                assert not (img.rootfs / bindir / cc).exists(), f"{img.name} holds {bindir}/{cc}"
        sbom = json.loads((IMAGES / f"{img.name}.cdx.json").read_text())
        listed = {c["name"].lower().replace("_", "-") for c in sbom["components"]}
        installed = {p.name.split("-")[0].lower().replace("_", "-") for p in site.glob("*.dist-info")}
        assert installed <= listed, f"{img.name}: SBOM misses {installed - listed}"
    # the data plane: no kopf, no Kubernetes client; the classifier's weights with their licence
    assert not (router.site() / "kopf").exists() and not (router.site() / "kubernetes").exists()
    data = router.site() / "oculis_router" / "classifier_data"
    shipped = ROOT / "runtime" / "oculis_router" / "classifier_data"
    for f in [*shipped.glob("*.npz"), shipped / "tokenizer.json", shipped / "NOTICE"]:  # NOTICE: their licences
        assert (data / f.name).read_bytes() == f.read_bytes(), f"{f.name} differs from the checkout's"
    assert "Apache-2.0" in (data / "NOTICE").read_text()
    assert (op.site() / "kopf").is_dir() and (op.site() / "kubernetes").is_dir()


# ------------------------------------------------------------------------------------------- router

def test_router_image_serves_a_chat_completion_and_metrics(images: dict[str, Image], tmp_path: Path) -> None:
    img = images["oculis-router"]
    sim_port, port, mport = free_port(), free_port(), free_port()
    sim_log = tmp_path / "sim.log"
    with sim_log.open("wb") as out:
        # the engine stands in on the host, from the dev venv: the simulator is never in an image
        sim = subprocess.Popen([sys.executable, "-m", "oculis_cli.main", "sim", "serve", LLAMA_8B, "--gpu",
                                "H100-80GB", "--host", "127.0.0.1", "--port", str(sim_port)],
                               stdout=out, stderr=subprocess.STDOUT)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "oculis-config.yaml").write_text(yaml.safe_dump({"oculis": {
        "upstreams": [{"name": "llama", "provider": "vllm", "model": LLAMA_8B,
                       "base_url": f"http://127.0.0.1:{sim_port}/v1"}],
        "routes": [{"name": "chat", "strategy": "semantic", "tiers": [  # the packaged classifier scores each prompt
            {"name": "simple", "match": {"complexity_below": 0.35}, "upstream": "llama"},
            {"name": "complex", "match": {}, "upstream": "llama"}]}]}}))
    args = list(img.config["process"]["args"])
    assert args[:2] == ["oculis", "serve"] and "/etc/oculis/oculis-config.yaml" in args
    # the image's own CMD, with this machine's free ports for its 8080/9090 (a pod has its own network)
    for flag, value in (("--port", port), ("--metrics-port", mport), ("--host", "127.0.0.1")):
        args[args.index(flag) + 1] = str(value)
    log = tmp_path / "router.log"
    try:
        eventually(lambda: sim.poll() is None and httpx.get(f"http://127.0.0.1:{sim_port}/health").status_code == 200,
                   timeout=120, what="oculis sim serve healthy")
        with run_image(img, args, {}, etc, log):
            url = f"http://127.0.0.1:{port}"
            eventually(lambda: httpx.get(f"{url}/readyz").status_code == 200, timeout=180,
                       what=f"the router image ready (log: {log})")
            r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json={
                "model": "chat", "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"]
            metrics = httpx.get(f"http://127.0.0.1:{mport}/metrics", timeout=30)
            assert metrics.status_code == 200 and "oculis_" in metrics.text
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]
    finally:
        sim.terminate()
        sim.wait(30)


# ------------------------------------------------------------------------------------------- operator

def test_operator_image_reconciles_a_gpuupstream_to_ready(images: dict[str, Image], kubeconfig: Path,
                                                           operator: OperatorProcess, namespace: str,
                                                           api: client.ApiClient, tmp_path: Path) -> None:
    from test_gpuupstream import World

    img = images["oculis-operator"]
    # The session's operator (run from the dev venv) stands aside so that only the image reconciles.
    operator.stop()
    try:
        _reconcile_with_image(img, kubeconfig, namespace, api, tmp_path)
    finally:
        operator.start()
        operator.wait_ready(operator.webhook_registered)  # type: ignore[attr-defined]

    world = World(api, namespace)
    assert world.ready("img")  # and the session's operator takes it over unchanged


def _reconcile_with_image(img: Image, kubeconfig: Path, namespace: str, api: client.ApiClient,
                          tmp_path: Path) -> None:
    from test_gpuupstream import World, upstream

    etc = tmp_path / "etc"
    etc.mkdir()
    # The dev operator's settings (webhook on 127.0.0.1 under a throwaway certificate), with its files
    # at the paths they have inside the chroot.
    ref = OperatorProcess(kubeconfig, etc)
    env = {k: v for k, v in ref.env.items() if k.startswith("OCULIS_") and k != "OCULIS_ENGINE_ENDPOINTS"}
    for key, file in (("OCULIS_WEBHOOK_CERT", "webhook.crt"), ("OCULIS_WEBHOOK_KEY", "webhook.key"),
                      ("OCULIS_WEBHOOK_CA", "webhook.crt")):
        env[key] = f"/etc/oculis/{file}"
    kc = yaml.safe_load(kubeconfig.read_text())
    for cluster in kc["clusters"]:
        ca = cluster["cluster"].pop("certificate-authority", None)
        if ca:
            cluster["cluster"]["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    (etc / "kubeconfig").write_text(yaml.safe_dump(kc))
    (etc / "operator.log").unlink(missing_ok=True)
    health = free_port()
    env.update({"KUBECONFIG": "/etc/oculis/kubeconfig", "POD_NAME": "oculis-operator-image",
                "POD_NAMESPACE": namespace, "OCULIS_LEASE_NAME": "oculis-operator-image",
                "OCULIS_HEALTH_PORT": str(health)})
    admission = client.AdmissionregistrationV1Api(api)

    def webhook_is_the_image() -> bool:
        cfg = admission.read_validating_webhook_configuration("oculis.dev")
        return bool(cfg.webhooks) and env["OCULIS_WEBHOOK_PORT"] in (cfg.webhooks[0].client_config.url or "")

    log = tmp_path / "operator-image.log"
    world = World(api, namespace)
    with run_image(img, list(img.config["process"]["args"]), env, etc, log):
        eventually(lambda: httpx.get(f"http://127.0.0.1:{health}/healthz").status_code == 200, timeout=180,
                   what=f"the operator image's /healthz (log: {log})")
        eventually(webhook_is_the_image, timeout=180, what=f"the operator image's webhook registered (log: {log})")
        world.create(upstream("img"))
        eventually(lambda: world.ready("img"), timeout=300,
                   what=f"GPUUpstream Ready, reconciled by the image (log: {log})")
        dep = world.deployment("img")
        assert dep.metadata.owner_references[0].kind == "GPUUpstream"
        assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]
