"""Package layout rules: no import package named `operator`; the router never loads kopf or the
Kubernetes client (its image does not ship them)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_operator_package_shadows_the_stdlib() -> None:
    offenders = [p for p in ROOT.rglob("operator/__init__.py") if ".venv" not in p.parts]
    assert offenders == []
    import operator

    assert operator.__file__ is not None and "site-packages" not in operator.__file__
    assert hasattr(operator, "itemgetter")


def test_router_and_schema_import_no_kopf_or_kubernetes() -> None:
    code = (
        "import sys, oculis, oculis_router.app, oculis_router.classify, oculis_cli.main, oculis_cli.serve\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'kopf', 'kubernetes'})\n"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_import_package_is_declared_for_the_wheel() -> None:
    # An undeclared subpackage works from the editable checkout but is missing from the installed
    # wheel, i.e. from the images (how oculis_router.providers once went missing).
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for top, folder in cfg["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join([top, *rel.parts]))
    assert found == set(cfg["packages"])
