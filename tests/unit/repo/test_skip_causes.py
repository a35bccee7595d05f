"""Which skips may hide a test under CI (tests/suite/skip_causes.py): only those inherent to the machine."""

from skip_causes import Cause, SkipCause, failure_message, inherent, parse, removable, under_ci, verdict


def test_a_cause_survives_the_trip_through_pytests_skip_reason() -> None:
    for skip in (inherent("the CPU has no AVX-512"),
                 removable("redis-server not installed", "apt-get install redis-server")):
        assert parse(skip.render()) == skip
        assert parse("Skipped: " + skip.render()) == skip  # as a report's longrepr gives it


def test_an_untagged_skip_counts_as_removable() -> None:
    skip = parse("Skipped: could not import 'lupa.lua51'")
    assert skip.cause is Cause.REMOVABLE and not skip.classified
    assert "a skip without a cause counts as removable" in failure_message(skip)


def test_under_ci_only_a_removable_cause_fails() -> None:
    assert verdict(removable("prometheus not installed", "apt-get install prometheus"), ci=True) == "fail"
    assert verdict(inherent("not x86_64"), ci=True) == "skip"
    assert verdict(removable("prometheus not installed", "apt-get install prometheus"), ci=False) == "skip"


def test_ci_is_read_as_ci_services_set_it() -> None:
    assert under_ci({"CI": "true"}) and under_ci({"CI": "1"}) and under_ci({"CI": "True"})
    assert not under_ci({}) and not under_ci({"CI": "false"}) and not under_ci({"CI": ""})


def test_the_failure_names_the_cause_and_its_fix() -> None:
    msg = failure_message(SkipCause("wrk not installed", Cause.REMOVABLE, "apt-get install wrk"))
    assert "wrk not installed" in msg and "apt-get install wrk" in msg and "CI=true" in msg
