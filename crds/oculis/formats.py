"""The text formats spec fields are checked against: Kubernetes label keys and values and resource
quantities (so a value the API server refuses in a pod template is refused at `kubectl apply`), and
Oculis' durations (`30s`, `10m`, `1h`).
"""

from __future__ import annotations

import re
from decimal import Decimal

# Kubernetes' syntax for names and values copied into the pod template as they are.
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
LABEL_VALUE_RULE = ("is not a valid label value: at most 63 letters, digits, '-', '_' or '.', starting and ending "
                    "with a letter or digit")
_QUALIFIED_KEY = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                            r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def key_problem(key: str) -> str | None:
    """Why `key` is not a Kubernetes label/annotation key (an optional DNS-subdomain prefix and '/',
    then a name of at most 63 characters), or None."""
    prefix, _, name = key.rpartition("/")
    if not _QUALIFIED_KEY.fullmatch(key) or len(name) > 63 or len(prefix) > 253:
        return (f"{key!r} is not a valid Kubernetes key: an optional DNS prefix such as example.com/, then at most "
                "63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit")
    return None


# Kubernetes' resource.Quantity syntax (a number, then an SI or binary suffix or a decimal exponent),
# so a bad quantity is refused at apply, not by the Deployment later. The API server's error message
# quotes a looser expression than its parser accepts ("1.2.3" matched that one).
QUANTITY = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$"
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1), "k": Decimal("1e3"),
           "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
           **{f"{p}i": Decimal(1024) ** (i + 1) for i, p in enumerate("KMGTPE")}}


def quantity(text: str) -> Decimal:
    """The value of a quantity QUANTITY accepts (64Gi -> 68719476736)."""
    m = re.fullmatch(QUANTITY, text)
    assert m, text
    number, suffix = m.group(1), m.group(3) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return Decimal(number) * Decimal(10) ** int(suffix[1:])
    return Decimal(number) * _SUFFIX[suffix]


DURATION = r"^[1-9][0-9]*(s|m|h)$"


def duration_seconds(text: str) -> int:
    """`30s`, `10m`, `1h` (DURATION) in seconds."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]


DURATION_OR_ZERO = r"^[0-9]+(s|m|h)$"


def duration_or_zero_seconds(text: str) -> int:
    """DURATION_OR_ZERO (`0s`, `30s`, `5m`) in seconds."""
    return int(text[:-1]) * {"s": 1, "m": 60, "h": 3600}[text[-1]]
