"""The status condition both kinds report (Ready, CapacityOK, Progressing, Degraded).
"""

from __future__ import annotations

from typing import Literal

from oculis.base import Model


class Condition(Model):
    """A status condition, as Kubernetes conventions define it."""

    type: str
    """Ready, CapacityOK, Progressing or Degraded"""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown"""
    reason: str
    """CamelCase reason"""
    message: str = ""
    """What happened, with the numbers and the fix"""
    last_transition_time: str | None = None
    """When status last changed"""
    observed_generation: int | None = None
    """The spec generation this condition describes"""
