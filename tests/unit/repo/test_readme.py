"""The README's Python examples run as written (documentation that drifts is worse than none)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[3] / "README.md"


def test_python_blocks_in_the_readme_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "the README should show the Python API"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
