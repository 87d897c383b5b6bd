"""The chaos explorer's command line (``celery_agboss.chaos.options``): a value it
cannot run with is refused before anything starts, with "could not run" (exit 2).

A duration that is not a finite positive number of seconds never bounds the run:
``nan`` passes every comparison (``nan <= 0`` is False, so it was accepted, then no
order was ever due and no bound was ever reached: the run spun for ever), and ``inf``
is never reached either.
"""

from __future__ import annotations

import pytest

from celery_agboss.chaos.options import EXIT_COULD_NOT_RUN, parse

DURATIONS = ("--fault-seconds", "--quiet-seconds")


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "0", "-1"])
@pytest.mark.parametrize("flag", DURATIONS)
def test_a_duration_that_never_bounds_the_run_is_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        parse(["--orders", "2", flag, value], environ={})
    assert refused.value.code == EXIT_COULD_NOT_RUN
    said = capsys.readouterr().err
    assert "could not run" in said and flag in said, said


@pytest.mark.parametrize("flag", DURATIONS)
def test_a_finite_positive_duration_is_taken_as_given(flag: str) -> None:
    options = parse(["--orders", "2", flag, "2.5"], environ={})
    taken = options.fault_seconds if flag == "--fault-seconds" else options.quiet_seconds
    assert taken == 2.5
