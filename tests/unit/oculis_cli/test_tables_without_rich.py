"""The images install only their own extra, so `oculis status --check-deps` there has no Rich: its tables
fall back to plain aligned columns instead of failing with ModuleNotFoundError."""

from __future__ import annotations

import builtins
import io
from typing import Any

import pytest

from oculis_cli import checks_output


def test_a_table_prints_plain_columns_without_rich(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_rich(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "rich" or name.startswith("rich."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_rich)
    out = io.StringIO()
    checks_output.table("checks", ["CHECK", "STATUS", "N"], [["cluster", "PASS", 1], ["prometheus", None, 12]], out,
                        right=["N"])
    assert out.getvalue().splitlines() == ["checks", "CHECK       STATUS   N", "cluster     PASS     1",
                                           "prometheus  -       12"]
