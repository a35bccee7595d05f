"""Preflight checks on paths that do not exist yet: on a fresh machine the real-engine installer measured
free space with `df` on the virtualenv's parent folder, which did not exist, read the empty answer as
"0 free" and skipped the whole tier with 72 GB free (issue 35). It now measures the nearest existing
folder (tests/realengine/install.sh, free_kib_for)."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INSTALL = ROOT / "tests" / "realengine" / "install.sh"


def _free_kib(path: Path) -> int:
    out = subprocess.run(["df", "-Pk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.splitlines()[1].split()[3])


def test_free_space_is_measured_where_a_folder_not_yet_created_will_be(tmp_path: Path) -> None:
    missing = tmp_path / "fresh-home" / ".cache" / "oculis-realengine" / "vllm-venv"
    proc = subprocess.run(["bash", "-c", f'source "{INSTALL}"; free_kib_for "$1"', "_", str(missing)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert abs(int(proc.stdout) - _free_kib(tmp_path)) <= max(1024, _free_kib(tmp_path) // 100)
    assert not missing.parent.exists()  # measuring creates nothing


def _stub(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text("#!/usr/bin/env bash\n" + body)
    (folder / name).chmod(0o755)


def test_the_installer_on_a_fresh_home_gets_past_the_disk_check(tmp_path: Path) -> None:
    # Everything before the disk check stubbed to pass (an AVX-512 x86_64 with CPython 3.11), and a df that,
    # like the real one, answers nothing for a missing path and 100 GiB for an existing one; `python3.11 -m
    # venv` stubbed to fail, so the installer stops right after the check and records why.
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _stub(stubs, "uname", "echo x86_64\n")
    _stub(stubs, "grep", '[ "${@: -1}" = /proc/cpuinfo ] && exit 0\nexec /usr/bin/grep "$@"\n')
    _stub(stubs, "python3.11", '[ "$1" = -m ] && { echo "stub: no venv here" >&2; exit 1; }\nexit 0\n')
    _stub(stubs, "df", '[ -e "${@: -1}" ] || { echo "df: ${@: -1}: No such file or directory" >&2; exit 1; }\n'
                       'echo "Filesystem 1024-blocks Used Available Capacity Mounted on"\n'
                       'echo "stub 209715200 0 104857600 0% /"\n')
    venv = tmp_path / "fresh-home" / ".cache" / "oculis-realengine" / "vllm-venv"
    proc = subprocess.run(["bash", str(INSTALL), str(venv)], capture_output=True, text=True, check=False,
                          env={**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    recorded = Path(f"{venv}.unavailable").read_text()
    assert "GiB free" not in recorded
    assert recorded.startswith("removable: python3.11 -m venv") and "stub: no venv here" in recorded
