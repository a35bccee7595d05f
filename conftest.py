"""Loaded by pytest for every tier: the suite's support folder on sys.path, and its plugin (tests/suite/
tiers_plugin.py: skips that may not hide a tier under CI, the table per tier, scaled test timeouts)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "tests" / "suite"))
pytest_plugins = ["tiers_plugin"]
