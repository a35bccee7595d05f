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


def test_each_extra_checks_exactly_what_pyproject_installs() -> None:
    import re
    import tomllib
    from pathlib import Path

    from oculis_cli.deps import EXTRAS, IMPORT_NAMES

    project = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"]
    declared = {"core": project["dependencies"], **project["optional-dependencies"]}
    for extra in EXTRAS:
        names = {re.split(r"[\[<>=!~ ]", req, maxsplit=1)[0].lower() for req in declared[extra.name]}
        assert {IMPORT_NAMES.get(n, n) for n in names} == set(extra.modules), extra.name
