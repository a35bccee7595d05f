import subprocess
import sys

from oculis_cli.main import main


def test_check_deps_lists_every_extra(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["status", "--check-deps"]) == 0
    out = capsys.readouterr().out
    for extra in ("core", "operator", "router"):
        assert f"  {extra} " in out


def test_console_script_runs_and_bad_arguments_exit_2() -> None:
    ok = subprocess.run([sys.executable, "-m", "oculis_cli.main", "--version"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("oculis ")
    bad = subprocess.run([sys.executable, "-m", "oculis_cli.main", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr and "Traceback" not in bad.stderr
