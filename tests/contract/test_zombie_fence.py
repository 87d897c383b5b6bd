"""PS4 (design: P1, P2): the zombie's write reaches the commit boundary after a take-over.

The guarantee itself is ``zombie_write_is_fenced`` in the contract catalogue; this is
its sabotage twin, and a check that the guarantee holds whichever of the zombie's
fenced writes is in flight (an effect or an intent).
"""

from __future__ import annotations

from celery_agboss.core import fault_points
from celery_agboss.core.protections import LEASE_CHECK_IN_SEPARATE_ROUND_TRIP
from celery_agboss.testing.contract.writes import zombie_race
from celery_agboss.testing.switches import sabotage
from tests.contract.conftest import StoreFactory


def test_a_zombie_write_released_after_a_take_over_is_refused_and_leaves_nothing(
    store_factory: StoreFactory,
) -> None:
    race = zombie_race(store_factory, point=fault_points.FENCED_BEFORE_BEGIN)
    assert race.successor.token == race.zombie.token + 1
    assert type(race.zombie_error).__name__ == "ExecutionFencedError"
    assert not race.zombie_wrote
    assert race.successor_wrote
    assert race.stored is not None
    assert (race.stored.token, race.stored.result) == (race.successor.token, {"by": "successor"})


def test_with_the_lease_checked_in_a_separate_round_trip_the_zombie_result_wins(
    store_factory: StoreFactory,
) -> None:
    """Sabotage twin: the zombie's check passes before the take-over, its write lands after
    it, and the new holder replays the zombie's result as if it were its own."""
    with sabotage(LEASE_CHECK_IN_SEPARATE_ROUND_TRIP):
        race = zombie_race(store_factory, point=fault_points.FENCED_BEFORE_BEGIN)
    assert race.zombie_error is None
    assert race.zombie_wrote
    assert not race.successor_wrote, "the new holder should have replayed the zombie's write"
    assert race.stored is not None
    assert (race.stored.token, race.stored.result) == (race.zombie.token, {"by": "zombie"})
