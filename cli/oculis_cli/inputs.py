"""Reading the CLI's inputs (the config, numbers, ports) so that every bad one is a one-line error naming
the flag, the value and the fix, never a traceback: NaN or infinity where a number is wanted, a config the
router's parser refuses. Files are read through oculis_measure.inputs (re-exported here for the commands).
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from oculis import ConfigError, RouterConfig, parse_config
from oculis_measure.inputs import InputError, load_yaml, read_text

__all__ = ["InputError", "finite_float", "load_yaml", "port_number", "read_config", "read_text", "writable"]


def one_line(exc: BaseException) -> str:
    """A ConfigError on one line: `source: invalid configuration: a; b`."""
    head, _, problems = str(exc).partition("\n")
    return " ".join([head, "; ".join(problems.splitlines())]).strip()


def read_config(path: Path) -> RouterConfig:
    """An `oculis-config.yaml` through the router's own parser (the one schema); InputError otherwise."""
    text = read_text(path, "config")
    try:
        return parse_config(text, str(path))
    except ConfigError as exc:
        raise InputError(one_line(exc)) from None
    except RecursionError:
        raise InputError(f"--config {path}: nested too deeply to parse; flatten the document") from None


def finite_float(raw: str) -> float:
    """argparse type: a finite number (float() alone accepts nan and inf, which every check then misses)."""
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number (nan and inf are not accepted)")
    return value


def port_number(raw: str) -> int:
    """argparse type: a TCP port 0-65535 in ASCII digits (str.isdigit alone admits '²' and '٣')."""
    if not (raw.isascii() and raw.isdigit()) or int(raw) > 65535:
        raise argparse.ArgumentTypeError(f"{raw!r} is not a port; give 0-65535")
    return int(raw)


def writable(path: Path, flag: str, example: str = "out.json") -> None:
    """An output file the command will write at its end, checked before any work: a run whose results could not
    be written was thrown away after its whole duration (QA3 Part 2 #9). InputError naming the flag otherwise."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory; give a file name inside it, e.g. {path / example}")
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: its folder {folder} does not exist; create it first or pick another path")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{flag} {path}: cannot write there (permission denied); pick a writable path")
