"""The install and the start, as a user does them (the first failure of last time:
``pip install`` lacked what kombu's Redis transport needs, so ``celery worker``
died at start with ``ModuleNotFoundError: packaging``).

No speed-ups here: these tests only install and start, so the default settings
(30 s lease, 30 s sweep interval, 300 s grace) stay as a user gets them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from celery_agboss.core.log_events import (
    STORE_ANSWERS,
    STORE_UNREACHABLE,
    SWEEP_QUEUE_NOT_CONSUMED,
)
from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.deployment.venv import DeployedVenv, run
from tests.support.processes import ManagedProcess
from tests.support.throwaway import free_ports

pytestmark = [pytest.mark.worker, pytest.mark.slow]

CLOSURE_SCRIPT = Path(__file__).with_name("closure.py")
TEST_ONLY = ("pytest", "pytest-timeout", "hypothesis", "requests", "flower", "mypy", "ruff")
NO_SPEEDUPS: dict[str, str] = {}
REPO_ROOT = Path(__file__).resolve().parents[2]
QUEUE_LINE = re.compile(r"^\s*\.> (\S+)\s+exchange=", re.M)


def _under(path: object, root: Path) -> bool:
    return isinstance(path, str) and Path(path).resolve().is_relative_to(root.resolve())


def _store_complaint(deployment: Deployment, timeout: float) -> tuple[ManagedProcess, str]:
    """The README's worker line, ready (a store that does not answer does not keep it
    from starting); the worker and the first ``store.unreachable`` line it logs."""
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    worker.wait_until(
        lambda: STORE_UNREACHABLE in worker.output(), timeout, message="the store's complaint"
    )
    return worker, next(line for line in worker.output().splitlines() if STORE_UNREACHABLE in line)


def test_the_venv_holds_the_wheel_and_only_what_it_requires(deployed_venv: DeployedVenv) -> None:
    """``pip check`` passes; every installed distribution is in the closure of the wheel's
    ``Requires-Dist`` (and pip's own), none is missing, no test-only package is there;
    the wheel ships every file of the package and nothing the tree does not have.
    No speed-ups (nothing runs)."""
    run([str(deployed_venv.pip), "check"])
    report = json.loads(run([str(deployed_venv.python), str(CLOSURE_SCRIPT), "celery-agboss"]))
    assert report["missing"] == [], f"required but not installed: {report['missing']}"
    assert report["extra"] == [], f"installed but not required by the wheel: {report['extra']}"
    for name in TEST_ONLY:
        assert name not in report["installed"], f"test-only package {name} in the venv"
    for needed in ("celery", "kombu", "redis", "packaging", "sqlalchemy", "psycopg", "alembic"):
        assert needed in report["required"], f"the wheel does not bring {needed}"
    shipped = deployed_venv.wheel_files()
    stale = sorted(shipped - deployed_venv.source_files_at_any_time)
    assert stale == [], (
        f"the wheel ships files the source tree does not have: {stale} "
        "(a stale build/ directory in the tree? setuptools reuses build/lib)"
    )
    missing = sorted(deployed_venv.source_files - shipped)
    assert missing == [], f"the wheel leaves out files of the package: {missing}"


def test_the_readme_worker_starts_from_the_installed_wheel(
    broker_url: str, sqlite_url: str, deploy: DeployFactory, deployed_venv: DeployedVenv
) -> None:
    """``celery -A shop agboss migrate`` then ``celery -A shop worker -l INFO``, exactly as
    the README gives them: the worker logs ready with no traceback and (started without
    ``-Q``) lists the sweep's queue ``agboss.sweep`` among its queues. In the same
    environment (no ``PYTHONPATH``, the venv's ``bin/`` first) ``celery_agboss``, Celery
    and kombu come from the venv, ``shop`` from the app directory, nothing from the
    repository. No speed-ups: the defaults, as a user starts."""
    deployment = deploy(broker_url, sqlite_url, speedups=NO_SPEEDUPS)
    migrated = deployment.migrate()
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    log = worker.output()
    assert "Traceback" not in log and "ModuleNotFoundError" not in log, log
    # The store got a deployment id of its own at migrate, and the worker says so.
    tenant = deployment.tenant
    assert tenant != "default" and f"deployment id {tenant}" in migrated, migrated
    assert f"celery_agboss tenant: {tenant} (the store's deployment id)" in log, log
    # `celery` resolved through the deployment's PATH: the venv's console script, run by
    # the venv's python (its shebang).
    cmdline = Path(f"/proc/{worker.pid}/cmdline").read_bytes().decode().split("\0")
    assert Path(cmdline[0]).parent == deployed_venv.bin, cmdline
    assert cmdline[1] == str(deployed_venv.bin / "celery"), cmdline
    queues = QUEUE_LINE.findall(log)
    assert sorted(queues) == ["agboss.sweep", "celery"], f"consumed queues: {queues}\n{log}"

    found = deployment.probe()
    for module in ("celery_agboss", "celery", "kombu", "sqlalchemy"):
        assert _under(found[module], deployed_venv.root), f"{module} from {found[module]}"
    assert _under(found["shop"], deployment.app_dir), found["shop"]
    assert _under(found["prefix"], deployed_venv.root), found["prefix"]
    path = found["path"]
    assert isinstance(path, list)
    assert not [p for p in path if p and _under(p, REPO_ROOT)], f"repository on sys.path: {path}"


@pytest.mark.redis
def test_a_worker_whose_queues_leave_out_the_sweep_says_so_once(
    redis_url_factory: Callable[[], str], sqlite_url: str, deploy: DeployFactory
) -> None:
    """A user who lists queues (``-Q celery``: the one flag here the README does not
    give, on purpose) gets one ``sweep.queue-not-consumed`` warning at start, and the
    worker does not consume ``agboss.sweep``. No speed-ups: the warning is at start."""
    deployment = deploy(redis_url_factory(), sqlite_url, speedups=NO_SPEEDUPS)
    deployment.migrate()
    worker = deployment.start_worker([*deployment.commands.worker, "-Q", "celery"])
    deployment.wait_ready(worker)
    log = worker.output()
    assert log.count(SWEEP_QUEUE_NOT_CONSUMED) == 1, log
    assert QUEUE_LINE.findall(log) == ["celery"], log


@pytest.mark.redis
def test_a_worker_started_before_migrate_says_what_to_run_and_goes_on_once_it_ran(
    redis_url_factory: Callable[[], str], sqlite_url: str, deploy: DeployFactory
) -> None:
    """The README's worker line before its ``agboss migrate``: ready, then one
    ``store.unreachable`` error naming the README's own migrate command for this app
    (``celery -A shop``); after the user runs it, ``store.answers``, without a restart.
    No speed-ups."""
    deployment = deploy(redis_url_factory(), sqlite_url, speedups=NO_SPEEDUPS)
    worker, complaint = _store_complaint(deployment, 30)
    assert "ERROR" in complaint and "`celery -A shop agboss migrate`" in complaint, complaint
    deployment.migrate()
    worker.wait_until(lambda: STORE_ANSWERS in worker.output(), 90, message="store.answers")
    assert worker.output().count(STORE_UNREACHABLE) == 1, worker.output()


@pytest.mark.redis
def test_a_worker_whose_store_does_not_answer_says_so_at_start(
    redis_url_factory: Callable[[], str], deploy: DeployFactory
) -> None:
    """``AGBOSS_DATABASE_URL`` names a PostgreSQL nothing listens on: the worker still
    starts (the broker is up) but says, as an error, that its store does not answer and
    what to check, and keeps trying. No speed-ups."""
    (port,) = free_ports(1)  # closed again: nothing listens there
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/shop"
    deployment = deploy(redis_url_factory(), url, speedups=NO_SPEEDUPS)
    worker, complaint = _store_complaint(deployment, 60)
    assert "error=StoreUnavailableError" in complaint, complaint
    assert "check agboss_database_url" in complaint and "Trying again" in complaint, complaint
    assert worker.running, "it keeps trying; it does not exit"


@pytest.mark.redis
def test_a_misspelt_setting_stops_the_worker_and_beat_with_one_did_you_mean(
    redis_url_factory: Callable[[], str], sqlite_url: str, deploy: DeployFactory
) -> None:
    """``AGBOSS_LEASE_TLL`` in the environment is warned about (the environment holds
    other programs' variables too); ``app.conf.agboss_lease_tll`` refuses the worker and
    beat, each saying so once, with the setting it meant. No speed-ups."""
    deployment = deploy(redis_url_factory(), sqlite_url, speedups={"AGBOSS_LEASE_TLL": "10"})
    deployment.migrate()
    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    assert worker.output().count("did you mean AGBOSS_LEASE_TTL?") == 1, worker.output()
    shop = deployment.app_dir / "shop.py"
    shop.write_text(
        shop.read_text(encoding="utf-8").replace(
            "AGBoss(app)", "app.conf.agboss_lease_tll = 10\nAGBoss(app)", 1
        ),
        encoding="utf-8",
    )
    for output in _refused_at_start(deployment):
        assert output.count("did you mean 'agboss_lease_ttl'?") == 1, output


@pytest.mark.redis
def test_a_setting_written_after_the_settings_were_read_stops_the_worker_and_beat(
    redis_url_factory: Callable[[], str], sqlite_url: str, deploy: DeployFactory
) -> None:
    """README's ``shop.py`` with, at its end, something that reads the settings (as a
    task module may at import) and then ``app.conf.agboss_lease_ttl = 10``: that value
    would never be used. The worker and beat refuse to start, each saying so once and
    naming the setting. No speed-ups."""
    deployment = deploy(redis_url_factory(), sqlite_url, speedups=NO_SPEEDUPS)
    deployment.migrate()
    shop = deployment.app_dir / "shop.py"
    late = "\nAGBoss(app).settings  # read here\napp.conf.agboss_lease_ttl = 10\n"
    shop.write_text(shop.read_text(encoding="utf-8") + late, encoding="utf-8")
    for output in _refused_at_start(deployment):
        assert "agboss_lease_ttl changed in app.conf after celery_agboss had read" in output


def _refused_at_start(deployment: Deployment) -> list[str]:
    """The README's worker line, then its beat line: each exits non-zero, saying once that
    celery_agboss refuses to start it; their outputs."""
    outputs = []
    for name, argv in (("worker", deployment.commands.worker), ("beat", deployment.commands.beat)):
        process = deployment.start(argv, f"{name}-refused")
        assert process.wait(60) != 0, process.describe()
        outputs.append(process.output())
        assert outputs[-1].count("celery_agboss refuses to start") == 1, outputs[-1]
    return outputs
