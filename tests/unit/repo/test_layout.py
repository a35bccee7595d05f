"""Package layout rules: no import package named `operator`; the router never loads kopf or the
Kubernetes client (its image does not ship them).

(Repository-wide tests live in this folder, not directly in tests/unit: pytest puts the folder of a
test module on sys.path, and tests/unit holds folders named like our packages, which would then
shadow them.)"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


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
    # wheel, i.e. from the images (how oculis_router.providers once went missing). setuptools finds the
    # packages under each source root; each top-level one must map to its own folder.
    import tomllib

    from setuptools import find_packages

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = cfg["packages"]["find"]["where"]
    found = set()
    for folder in cfg["package-dir"].values():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT / folder.split("/")[0]).parts))
    assert found == {p for root in roots for p in find_packages(str(ROOT / root))}
    assert {folder.split("/")[0] for folder in cfg["package-dir"].values()} == set(roots)
    assert all(cfg["package-dir"][top] == f"{folder.split('/')[0]}/{top}" for top, folder in cfg["package-dir"].items())


def test_simulator_ships_in_neither_image_and_nothing_imports_it() -> None:
    # Dockerfile.runtime / Dockerfile.operator copy only their folders; the simulator is a dev/sandbox tool.
    for dockerfile in ("Dockerfile.runtime", "Dockerfile.operator"):
        assert "simulator" not in (ROOT / dockerfile).read_text()
    assert "oculis_sim" not in imported_by("oculis_router.app, oculis_operator.handlers, oculis_cli.main")


def imported_by(modules: str) -> set[str]:
    code = f"import sys, {modules}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_functional_core_imports_no_io_layer() -> None:
    # Spec to manifests, capacity math, rollout and route rendering are pure: no kopf, no Kubernetes client.
    core = ("oculis_operator.capacity, oculis_operator.catalog, oculis_operator.engine_args, oculis_operator.render, "
            "oculis_operator.rollout, oculis_operator.reconcile, oculis_operator.conditions, "
            "oculis_operator.admission, oculis_operator.routeconfig")
    assert not imported_by(core) & {"kopf", "kubernetes", "oculis_router"}
    # The schema imports neither side.
    assert not imported_by("oculis, oculis.crdgen") & {"kopf", "kubernetes", "oculis_operator", "oculis_router"}
    # The router's decisions never reach into the operator.
    assert "oculis_operator" not in imported_by("oculis_router.app, oculis_router.decide, oculis_router.cache")


def test_test_modules_have_unique_basenames() -> None:
    # pytest imports test modules by basename (rootdir-relative "rootless" folders): two files of one
    # name in tests/ and e2e/tests stop the whole run at collection ("import file mismatch").
    files = [p for p in (*ROOT.glob("tests/**/test_*.py"), *ROOT.glob("e2e/tests/test_*.py"))
             if ".venv" not in p.parts]
    seen: dict[str, Path] = {}
    clashes = [(seen[p.name], p) for p in files if seen.setdefault(p.name, p) != p]
    assert not clashes, clashes


def module_imports(path: Path) -> set[str]:
    """The modules a source file imports (absolute names, at any depth: function-level imports count)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


# The command shells of cli/ that take no arguments themselves: they read the commands' sources (files, the
# cluster, Prometheus) or write their output. Anything else there without argparse is a pure core that
# belongs in measure/oculis_measure.
CLI_SHELL_HELPERS = {"__init__", "checks_output", "cost_sources"}


def test_cli_holds_only_commands_and_measure_imports_no_command() -> None:
    cli = sorted((ROOT / "cli" / "oculis_cli").glob("*.py"))
    cores = [p.name for p in cli if p.stem not in CLI_SHELL_HELPERS and "argparse" not in module_imports(p)]
    assert cores == [], f"pure modules in cli/oculis_cli (move them to measure/oculis_measure): {cores}"
    measure = [p for p in (ROOT / "measure" / "oculis_measure").rglob("*.py")]
    back = {p.relative_to(ROOT).as_posix(): sorted(m for m in module_imports(p) if m.startswith("oculis_cli"))
            for p in measure}
    assert {k: v for k, v in back.items() if v} == {}
    assert "argparse" not in set().union(*(module_imports(p) for p in measure))
    # The simulator reads its workloads through the measurement library, not the CLI's package.
    for name in ("workload.py", "config.py"):
        assert not {m for m in module_imports(ROOT / "simulator" / "oculis_sim" / name) if m.startswith("oculis_cli")}
    assert "oculis_cli" not in imported_by("oculis_measure.bench.stats, oculis_measure.bench.workload, "
                                           "oculis_measure.route.window, oculis_measure.eval.core, "
                                           "oculis_measure.cache.advise, oculis_measure.checks.core")
