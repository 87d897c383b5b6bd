"""Fault points, sabotage switches and the pytest plugin of celery_agboss.testing."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from celery_agboss.core import fault_points as core_faults
from celery_agboss.core import sabotage as core_sabotage
from celery_agboss.core.fault_points import FENCED_BEFORE_COMMIT, OUTBOUND_BEFORE_SEND, fault_point
from celery_agboss.core.protections import (
    EXPIRY_BY_CALLER_CLOCK,
    HOLDER_TRUSTS_LEASE_FOREVER,
    LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,
    RENEW_REVIVES_EXPIRED_LEASE,
)
from celery_agboss.errors import FaultInjected, SabotageRefusedError
from celery_agboss.testing import (
    PausedPointTimeoutError,
    arm_fault,
    arm_pause,
    arm_raise,
    arm_sleep,
    disarm_all,
    sabotage,
)
from celery_agboss.testing.switches import allowed, names
from tests.support.processes import in_a_thread

JOIN_SECONDS = 10.0
SUBPROCESS_SECONDS = 120.0


def _reach(point: str, **context: object) -> tuple[threading.Thread, dict[str, object]]:
    """A thread that reaches ``point`` once, as production code would."""

    def run() -> str:
        fault_point(point, **context)
        return "passed"

    return in_a_thread(run)


# --- pause -------------------------------------------------------------------------------


def test_a_paused_point_holds_the_thread_that_reaches_it_until_released() -> None:
    paused = arm_pause(OUTBOUND_BEFORE_SEND)
    thread, box = _reach(OUTBOUND_BEFORE_SEND)
    paused.wait_reached(JOIN_SECONDS)
    time.sleep(0.05)  # give a wrongly unblocked thread the chance to get through
    assert thread.is_alive() and box == {}
    paused.release()
    thread.join(JOIN_SECONDS)
    assert box == {"result": "passed"}
    assert paused.hits == 1 and paused.released


def test_a_pause_applies_only_to_the_hits_it_is_armed_for() -> None:
    with arm_pause(FENCED_BEFORE_COMMIT, only={"holder": "zombie"}) as paused:
        fault_point(FENCED_BEFORE_COMMIT, holder="new-holder")  # not this one: passes
        thread, box = _reach(FENCED_BEFORE_COMMIT, holder="zombie")
        paused.wait_reached(JOIN_SECONDS)
        assert thread.is_alive()
    thread.join(JOIN_SECONDS)
    assert box == {"result": "passed"}


def test_a_pause_with_a_predicate_sees_the_points_context() -> None:
    seen: list[object] = []

    def only(context: object) -> bool:
        seen.append(context)
        return False

    arm_pause(OUTBOUND_BEFORE_SEND, only=only)
    fault_point(OUTBOUND_BEFORE_SEND, key="k-1")
    assert seen == [{"key": "k-1"}]


def test_a_pause_nobody_releases_gives_up_and_raises_in_the_paused_thread() -> None:
    paused = arm_pause(OUTBOUND_BEFORE_SEND, timeout=0.05)
    thread, box = _reach(OUTBOUND_BEFORE_SEND)
    thread.join(JOIN_SECONDS)
    assert isinstance(box["error"], PausedPointTimeoutError)
    assert isinstance(box["error"], FaultInjected)
    assert paused.timed_out


def test_a_pause_timeout_error_pickles() -> None:
    error = PausedPointTimeoutError("gave up", point=OUTBOUND_BEFORE_SEND)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is PausedPointTimeoutError
    assert copy.point == OUTBOUND_BEFORE_SEND and str(copy) == "gave up"


def test_waiting_for_a_point_nobody_reaches_fails_instead_of_hanging() -> None:
    paused = arm_pause(OUTBOUND_BEFORE_SEND)
    with pytest.raises(AssertionError, match="not reached"):
        paused.wait_reached(0.01)


def test_disarm_all_wakes_a_paused_thread_and_disarms_every_point() -> None:
    arm_pause(OUTBOUND_BEFORE_SEND)
    arm_raise(FENCED_BEFORE_COMMIT)
    thread, box = _reach(OUTBOUND_BEFORE_SEND)
    time.sleep(0.05)
    disarm_all()
    thread.join(JOIN_SECONDS)
    assert box == {"result": "passed"}
    fault_point(FENCED_BEFORE_COMMIT)  # disarmed: nothing raised


# --- raise, sleep, anything --------------------------------------------------------------


def test_an_armed_raise_fires_times_then_lets_the_point_pass() -> None:
    armed = arm_raise(FENCED_BEFORE_COMMIT, times=2)
    for _ in range(2):
        with pytest.raises(FaultInjected, match=r"fenced\.before-commit"):
            fault_point(FENCED_BEFORE_COMMIT)
    fault_point(FENCED_BEFORE_COMMIT)
    assert armed.hits == 2 and armed.remaining == 0 and armed.reached


@pytest.mark.parametrize(
    "exc",
    [ConnectionResetError("cut"), ConnectionResetError, SystemExit],
    ids=["instance", "class", "base-exception"],
)
def test_an_armed_raise_raises_the_given_exception(
    exc: BaseException | type[BaseException],
) -> None:
    arm_raise(OUTBOUND_BEFORE_SEND, exc)
    expected = exc if isinstance(exc, type) else type(exc)
    with pytest.raises(expected):
        fault_point(OUTBOUND_BEFORE_SEND)


def test_an_armed_sleep_delays_the_thread_and_disarm_all_cuts_it_short() -> None:
    arm_sleep(OUTBOUND_BEFORE_SEND, 0.05)
    started = time.monotonic()
    fault_point(OUTBOUND_BEFORE_SEND)
    assert time.monotonic() - started >= 0.04
    long_sleep = arm_sleep(OUTBOUND_BEFORE_SEND, 60)
    thread, box = _reach(OUTBOUND_BEFORE_SEND)
    long_sleep.wait_reached(JOIN_SECONDS)
    disarm_all()
    thread.join(JOIN_SECONDS)
    assert box == {"result": "passed"}


def test_arm_fault_runs_any_action_with_the_points_context() -> None:
    calls: list[object] = []
    arm_fault(OUTBOUND_BEFORE_SEND, calls.append)
    fault_point(OUTBOUND_BEFORE_SEND, attempt=2)
    assert calls == [{"attempt": 2}]


def test_an_unknown_point_or_a_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault point"):
        arm_raise("no.such-point")
    with pytest.raises(ValueError, match="times"):
        arm_pause(OUTBOUND_BEFORE_SEND, times=0)


def test_the_plugin_disarmed_the_points_the_tests_above_left_armed() -> None:
    # Several tests above end with points still armed (a pause never reached, a
    # predicate that refused); the plugin's autouse fixture must have cleared them.
    assert core_faults._armed == {}


# --- sabotage ------------------------------------------------------------------------------


def _python(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh interpreter, its output captured (bounded)."""
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_SECONDS,
        check=False,
    )


def _pytest_in(folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A pytest run of ``folder``'s tests, from ``folder``, in a fresh interpreter."""
    return _python("-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder), cwd=folder, env=env)


def _without_sabotage_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if k not in (core_sabotage.ENV_SWITCH, core_sabotage.SUBPROCESS_SWITCH, "AGBOSS_SABOTAGE")
    }


_TRY_SABOTAGE = textwrap.dedent(
    """
    from celery_agboss.testing import SabotageRefusedError, sabotage
    from celery_agboss.testing.switches import names
    try:
        with sabotage(names()[0]):
            print("sabotaged")
    except SabotageRefusedError:
        print("refused")
    """
)


@pytest.mark.parametrize("env_switch", [None, "1"], ids=["no-env-var", "env-var-but-no-pytest"])
def test_sabotage_is_refused_outside_a_test_run(env_switch: str | None) -> None:
    env = _without_sabotage_env()
    if env_switch is not None:
        env[core_sabotage.ENV_SWITCH] = env_switch
    done = _python("-c", _TRY_SABOTAGE, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


def test_an_application_that_imports_pytest_is_refused() -> None:
    """A deployment given the variables by hand, whose application imports pytest (as
    ``celery.contrib.pytest`` does): pytest runs no test there, so every protection stays."""
    env = {k: v for k, v in _without_sabotage_env().items() if not k.startswith("PYTEST")}
    env[core_sabotage.ENV_SWITCH] = "1"
    done = _python("-c", "import pytest\n" + _TRY_SABOTAGE, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


def _try_sabotage_in_a_child(subprocess_switch: str) -> str:
    env = {
        **_without_sabotage_env(),
        core_sabotage.ENV_SWITCH: "1",
        core_sabotage.SUBPROCESS_SWITCH: subprocess_switch,
    }
    done = _python("-c", _TRY_SABOTAGE, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_worker_started_by_this_test_run_may_be_sabotaged() -> None:
    assert _try_sabotage_in_a_child(str(os.getpid())) == "sabotaged"


def test_a_subprocess_switch_set_by_hand_is_refused() -> None:
    """What someone could put in a deployment's environment: a flag, or the pid of a
    process that is not the worker's pytest ancestor."""
    assert _try_sabotage_in_a_child("1") == "refused"
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _try_sabotage_in_a_child(str(unrelated.pid)) == "refused"
    finally:
        unrelated.kill()
        unrelated.wait(SUBPROCESS_SECONDS)


def test_an_ancestor_that_pytest_did_not_start_is_refused() -> None:
    """A named ancestor counts when it is pytest or what pytest started (a pytest-xdist
    worker, whose command line does not say pytest): here a plain wrapper started it,
    so the child it starts is refused, whatever its environment says."""
    middle = (
        "import os, subprocess, sys\n"
        f"env = {{**os.environ, {core_sabotage.ENV_SWITCH!r}: '1'}}\n"
        f"env[{core_sabotage.SUBPROCESS_SWITCH!r}] = str(os.getpid())\n"
        f"code = {_TRY_SABOTAGE!r}\n"
        "done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,"
        " text=True, timeout=60)\n"
        "sys.stdout.write(done.stdout)\n"
    )
    wrapper = (
        "import os, subprocess, sys\n"
        f"code = {middle!r}\n"
        "env = {**os.environ, 'PYTEST_XDIST_WORKER': 'gw9'}\n"
        "done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True,"
        " text=True, timeout=60)\n"
        "sys.stdout.write(done.stdout)\n"
    )
    done = _python("-c", wrapper, env=_without_sabotage_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "refused"


def test_sabotage_is_refused_in_a_test_that_did_not_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(core_sabotage.ENV_SWITCH, raising=False)
    with pytest.raises(SabotageRefusedError), sabotage(EXPIRY_BY_CALLER_CLOCK):
        pass  # pragma: no cover - never entered
    assert not core_sabotage.active(EXPIRY_BY_CALLER_CLOCK)


def test_sabotage_switches_a_protection_off_for_the_block_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(core_sabotage.ENV_SWITCH, "1")
    name = RENEW_REVIVES_EXPIRED_LEASE
    assert allowed() and sabotage.allowed()
    with sabotage(name):
        assert core_sabotage.active(name)
    assert not core_sabotage.active(name)


def test_sabotage_refuses_a_protection_nobody_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(core_sabotage.ENV_SWITCH, "1")
    with pytest.raises(ValueError, match="unknown protections"), sabotage("no-such-protection"):
        pass  # pragma: no cover - never entered


def test_names_lists_every_protection_that_can_be_switched_off() -> None:
    listed = names()
    assert listed == sorted(listed) == sabotage.names()
    assert {
        LEASE_CHECK_IN_SEPARATE_ROUND_TRIP,
        RENEW_REVIVES_EXPIRED_LEASE,
        EXPIRY_BY_CALLER_CLOCK,
        HOLDER_TRUSTS_LEASE_FOREVER,
    } <= set(listed)


# --- the pytest plugin, as a user's project gets it ---------------------------------------

_USER_TESTS = textwrap.dedent(
    """
    from celery_agboss.core import fault_points
    from celery_agboss.testing import FakeGateway, VirtualClock, arm_pause


    def test_a_user_arms_a_point_and_forgets_it():
        arm_pause(fault_points.OUTBOUND_BEFORE_SEND)
        assert fault_points._armed


    def test_the_next_test_starts_with_nothing_armed():
        assert fault_points._armed == {}


    def test_the_gateway_and_the_store_share_the_clock(agboss_clock, fake_gateway, agboss_store):
        assert isinstance(agboss_clock, VirtualClock) and isinstance(fake_gateway, FakeGateway)
        before = agboss_store.now_ms()
        agboss_clock.advance(3600)
        assert agboss_store.now_ms() - before >= 3_600_000
        assert fake_gateway.now() - agboss_clock.now() < 1
    """
)


def test_the_plugin_gives_a_users_project_its_fixtures_and_disarms_after_each_test(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_user_code.py").write_text(_USER_TESTS)
    done = _pytest_in(tmp_path, env=_without_sabotage_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_importing_the_plugin_imports_neither_celery_nor_sqlalchemy() -> None:
    code = (
        "import sys, celery_agboss.testing.pytest_plugin, celery_agboss.testing; "
        "print(sorted(m for m in ('celery', 'kombu', 'sqlalchemy') if m in sys.modules))"
    )
    done = _python("-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_agboss_store_fixture_fails_clearly_when_the_store_cannot_be_imported(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(
        "import sys\nsys.modules['celery_agboss.testing.stores'] = None  # unimportable\n"
    )
    (tmp_path / "test_store.py").write_text("def test_uses_a_store(agboss_store):\n    pass\n")
    done = _pytest_in(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the agboss_store fixture needs celery_agboss.testing.stores" in done.stdout
