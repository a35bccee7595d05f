"""Deadlines that grow with the machine (tests/suite/time_scale.py): one knob, and the load while waiting."""

import pytest
from time_scale import ENV, MAX_LOAD_FACTOR, Deadline, knob, load_factor


def test_the_knob_multiplies_and_a_bad_value_is_one_line_naming_it() -> None:
    assert knob({}) == 1.0 and knob({ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "fast", "inf", "nan"):
        with pytest.raises(ValueError, match=f"{ENV}=.*is not a number above 0"):
            knob({ENV: bad})


def test_load_stretches_a_wait_between_one_and_the_cap() -> None:
    assert load_factor(0.3, 2) == 1.0
    assert load_factor(4.0, 2) == 2.0  # a second test run beside this one
    assert load_factor(500.0, 2) == MAX_LOAD_FACTOR


def test_a_deadline_stretches_while_the_machine_is_loaded_and_never_shrinks_back() -> None:
    now, scale = [0.0], [1.0]
    d = Deadline(5, clock=lambda: now[0], scale=lambda: scale[0])
    now[0] = 6
    assert d.expired()
    scale[0] = 2.0  # the load doubled while waiting
    assert not d.expired() and d.left() == 4
    scale[0] = 1.0  # and fell again: the wait keeps what it was given
    assert not d.expired()
    now[0] = 10.5
    assert d.expired() and "5s x time scale 2.0" in d.describe()
