"""How the operator scales: N GPUUpstreams applied at once to a real local control plane.

Brings up its own sandbox (separate state and ports) with enough simulated H100 nodes, runs the
operator as a process, applies N one-replica GPUUpstreams and prints, per N: seconds until all are
Ready, API requests per reconcile (the operator's own reads and writes; kopf's watch streams
excluded), reconciles per upstream, and the operator's peak RSS.

    .venv/bin/python bench/operator_scale.py --n 100 300 1000
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PORTS = {"ETCD": 43790, "ETCD_PEER": 43800, "APISERVER": 46443, "CONTROLLER_MANAGER": 40257,
         "SCHEDULER": 40259, "KWOK": 40247}


def sh(*argv: str, env: dict[str, str], input_: str | None = None) -> str:
    proc = subprocess.run(argv, env=env, input=input_, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv[:3])} failed: {proc.stderr[-2000:]}")
    return proc.stdout


def upstream(i: int) -> dict[str, object]:
    return {"apiVersion": "oculis.dev/v1alpha1", "kind": "GPUUpstream", "metadata": {"name": f"m{i:04d}"},
            "spec": {"provider": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "replicas": 1,
                     "gpu": {"product": "H100-80GB", "count": 1}, "engine": {"maxModelLen": 8192}}}


def run(n: int, env: dict[str, str], kubectl: str, work: Path) -> dict[str, float]:
    ns = f"scale-{n}"
    sh(kubectl, "create", "namespace", ns, env=env)
    log = open(work / f"operator-{n}.log", "wb")  # noqa: SIM115
    kopf = str(Path(sys.executable).with_name("kopf"))
    op = subprocess.Popen([kopf, "run", "--standalone", "--namespace", ns, "-m", "oculis_operator.handlers"],
                          env=env, stdout=log, stderr=log, start_new_session=True)
    time.sleep(3)
    t0 = time.monotonic()
    items = [upstream(i) for i in range(n)]
    for start in range(0, n, 100):
        sh(kubectl, "apply", "-n", ns, "-f", "-", env=env,
           input_=json.dumps({"apiVersion": "v1", "kind": "List", "items": items[start:start + 100]}))
    peak = 0
    while True:
        out = json.loads(sh(kubectl, "get", "gu", "-n", ns, "-o", "json", env=env))
        ready = sum(1 for it in out["items"] if any(c["type"] == "Ready" and c["status"] == "True"
                                                    for c in it.get("status", {}).get("conditions", [])))
        try:
            hwm = next(ln for ln in Path(f"/proc/{op.pid}/status").read_text().splitlines() if ln.startswith("VmHWM"))
            peak = max(peak, int(hwm.split()[1]))
        except (OSError, StopIteration):
            pass
        if ready == n:
            break
        if time.monotonic() - t0 > 1800 or op.poll() is not None:
            raise SystemExit(f"only {ready}/{n} Ready; see {work}/operator-{n}.log")
        time.sleep(1)
    elapsed = time.monotonic() - t0
    time.sleep(3)
    os.killpg(op.pid, signal.SIGTERM)
    op.wait(60)
    text = (work / f"operator-{n}.log").read_text(errors="replace")
    m = re.findall(r"oculis totals: (\d+) reconciles, (\d+) API requests", text)
    reconciles, requests = (int(m[-1][0]), int(m[-1][1])) if m else (0, 0)
    sh(kubectl, "delete", "namespace", ns, "--wait=false", env=env)
    return {"n": n, "seconds": elapsed, "reconciles_per_upstream": reconciles / n,
            "requests_per_reconcile": requests / max(reconciles, 1), "peak_rss_mib": peak / 1024}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="+", default=[100, 300, 1000])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="oculis-scale-"))
    nodes = max(args.n) // 8 + 2
    pools = work / "pools.yaml"
    pools.write_text(f"pools: [{{name: h100, product: H100-80GB, nodes: {nodes}, gpusPerNode: 8}}]\n")
    env = {**os.environ, "OCULIS_E2E_STATE": str(work / "cluster")}
    env.update({f"OCULIS_E2E_{k}_PORT": str(v) for k, v in PORTS.items()})
    cluster = str(ROOT / "e2e" / "cluster")
    try:
        kubeconfig = sh(cluster, "up", "--pools", str(pools), env=env).strip().splitlines()[-1]
        env["KUBECONFIG"] = kubeconfig
        kubectl = str(Path(sh(cluster, "bin-dir", env=env).strip().splitlines()[-1]) / "kubectl")
        sh(kubectl, "apply", "--server-side", "-f", str(ROOT / "crds"), env=env)
        sh(kubectl, "wait", "--for=condition=Established", "crd/gpuupstreams.oculis.dev", env=env)
        print(f"{nodes} simulated H100 nodes; one-replica Llama-3.1-8B GPUUpstreams applied in batches of 100")
        print(f"{'N':>6} {'all Ready (s)':>14} {'reconciles/upstream':>20} {'API requests/reconcile':>23} "
              f"{'operator peak RSS':>18}")
        for n in args.n:
            r = run(n, env, kubectl, work)
            print(f"{r['n']:>6} {r['seconds']:>14.1f} {r['reconciles_per_upstream']:>20.1f} "
                  f"{r['requests_per_reconcile']:>23.1f} {r['peak_rss_mib']:>15.0f} MiB", flush=True)
    finally:
        subprocess.run([cluster, "down"], env=env, capture_output=True, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
