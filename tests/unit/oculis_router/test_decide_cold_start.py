"""decide.cold_start: which planned tiers a request tries when some upstreams are scaled to zero."""

from __future__ import annotations

import pytest

from oculis_router.decide import ColdStart, cold_start

CASES = [
    ("first serves", [False, False], "escalate", ColdStart("none", (0, 1))),
    ("a later tier at zero is skipped", [False, True, False], "fail", ColdStart("none", (0, 2))),
    ("escalate to the next serving tier", [True, False, False], "escalate", ColdStart("escalated", (1, 2))),
    ("escalate past several at zero", [True, True, False], "escalate", ColdStart("escalated", (2,))),
    ("escalate with nothing serving waits", [True, True], "escalate", ColdStart("wait", (0, 1))),
    ("wait", [True, False], "wait", ColdStart("wait", (0, 1))),
    ("fail", [True, False], "fail", ColdStart("fail", (0, 1))),
    ("no tiers", [], "escalate", ColdStart("none", ())),
]


@pytest.mark.parametrize(("name", "zero", "mode", "want"), CASES, ids=[c[0] for c in CASES])
def test_cold_start_order_table(name: str, zero: list[bool], mode: str, want: ColdStart) -> None:
    assert cold_start(zero, mode) == want
