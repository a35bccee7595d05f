"""Reading measurement inputs (workload profiles, suites, price files) so that every bad one is a one-line
error, never a traceback: a file that is a directory or not UTF-8, YAML/JSON nested deeper than the parser
can recurse. The CLI and the simulator read their files through these.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class InputError(ValueError):
    """A bad CLI input; the message is one line, ready to print after the command's name."""


def read_text(path: Path, what: str) -> str:
    """The file's text; InputError when it cannot be read (a directory, say) or is not UTF-8."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} {path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                         "save it as UTF-8") from None


def load_yaml(text: str, what: str) -> Any:
    """The YAML/JSON document; InputError for invalid or too deeply nested input."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{what}: not valid YAML/JSON: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise InputError(f"{what}: nested too deeply to parse; flatten the document") from None
