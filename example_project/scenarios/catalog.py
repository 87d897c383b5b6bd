"""The scenario table: each PS id, its title, and the function that runs one column of it.

A scenario function ``run(world, protected, say) -> Outcome`` plays the scenario's story
once (design: scenarios): ``protected=False`` with the plain-Celery twin
(``example_project.unprotected``), ``protected=True`` with the shop's ``PaymentTask``s.
``say`` prints a line of what happened. The ``Outcome`` is what the table shows, counted at
the gateway (and, for what the gateway cannot see, in the shop's ledger), and whether it met
the scenario's bar: for the protected column, one charge (or the boundary the scenario
states); for the unprotected column, the harm the scenario names shown happening (a scenario
whose harm did not show this time says so, it is not hidden).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from example_project.scenarios.world import World

Say = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    text: str  # "2 charges", "1 charge, reconciled"
    as_expected: bool
    simulated: str | None = None  # what part is simulated, when one is


@dataclass(frozen=True)
class Scenario:
    id: str
    title: str
    run: Callable[[World, bool, Say], Outcome]


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    id: str, title: str
) -> Callable[[Callable[[World, bool, Say], Outcome]], Callable[[World, bool, Say], Outcome]]:
    def register(
        run: Callable[[World, bool, Say], Outcome],
    ) -> Callable[[World, bool, Say], Outcome]:
        if id in SCENARIOS:
            raise ValueError(f"scenario {id} is registered twice")
        SCENARIOS[id] = Scenario(id, title, run)
        return run

    return register


def charges(n: int) -> str:
    return f"{n} charge" + ("" if n == 1 else "s")


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
