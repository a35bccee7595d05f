"""Reading the CLI's inputs (files, numbers, ports) so that every bad one is a one-line error naming the
flag, the value and the fix, never a traceback: a file that is a directory or not UTF-8, YAML/JSON nested
deeper than the parser can recurse, NaN or infinity where a number is wanted.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import yaml

from oculis import ConfigError, RouterConfig, parse_config


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
