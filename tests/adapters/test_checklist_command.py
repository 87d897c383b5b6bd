"""``celery -A proj agboss checklist --adapter module:object``, as a team runs it by hand.

Against the fake server speaking each gateway's dialect, so the verdicts are known:
Stripe passes (G3 skipped: the command has no gateway clock), Adyen fails G2 (it has
no payment lookup) and the command exits 1; both take only their own payment (design: OWN).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_agboss.cli import EXIT_REFUSED, EXIT_USAGE, agboss
from celery_agboss.testing.gateway import FakeGateway
from celery_agboss.testing.gateway_server import FakeGatewayServer, documented_capabilities
from tests.adapters.checklist_targets import URL_ENV, app
from tests.support.processes import run_python

REPO_ROOT = Path(__file__).resolve().parents[2]
TARGETS = "tests.adapters.checklist_targets"


@pytest.fixture(params=["stripe", "adyen"])
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name: str = request.param
    gateway = FakeGateway(capabilities=documented_capabilities(name))
    with FakeGatewayServer(gateway, dialect=name) as server:
        monkeypatch.setenv(URL_ENV, server.url)
        yield name


def run(*args: str) -> Result:
    return CliRunner().invoke(
        agboss, ["checklist", *args], obj=CLIContext(app=app, no_color=True, workdir=None)
    )


def test_the_checklist_reports_each_gateway_at_its_documented_level(fake: str) -> None:
    result = run("--adapter", f"{TARGETS}:{fake}_on_fake", "--key-prefix", "cli-run-1", "--json")
    report = json.loads(result.output)
    statuses = {r["requirement"]: r["status"] for r in report["results"]}
    expected = {
        "stripe": {"G1": "PASSED", "G2": "PASSED", "G3": "SKIPPED", "G4": "PASSED", "G5": "PASSED"},
        "adyen": {"G1": "PASSED", "G2": "FAILED", "G3": "SKIPPED", "G4": "PASSED", "G5": "FAILED"},
    }[fake] | {"OWN": "PASSED", "RECONCILE": "PASSED"}
    assert statuses == expected
    assert report["key_prefix"] == "cli-run-1"
    assert result.exit_code == (0 if fake == "stripe" else EXIT_REFUSED)


def test_people_read_one_line_per_requirement_and_the_verdict(fake: str) -> None:
    result = run("--adapter", f"{TARGETS}:{fake}_on_fake")
    lines = result.output.splitlines()
    assert [line.split(" ", 1)[0] for line in lines[:6]] == ["G1", "G2", "G3", "G4", "G5", "OWN"]
    assert lines[-1].endswith(
        "checklist passed, G3 not probed (no gateway clock)"
        if fake == "stripe"
        else "checklist FAILED"
    )
    assert "agboss-checklist-" in lines[-1], "a key prefix of its own per run"


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("no-colon", "is not module:object"),
        ("tests.adapters.no_such_module:x", "cannot import"),
        (f"{TARGETS}:missing", "has no 'missing'"),
        (f"{TARGETS}:not_an_adapter", "has no send(amount, idempotency_key)"),
    ],
)
def test_a_wrong_target_is_a_usage_error_saying_what_is_wrong(target: str, says: str) -> None:
    result = run("--adapter", target)
    assert result.exit_code == EXIT_USAGE
    assert says in result.output


def test_the_real_command_line_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``celery -A … agboss checklist`` in a process of its own, as a user types it."""
    with FakeGatewayServer(FakeGateway(), dialect="stripe") as server:
        env = {**os.environ, URL_ENV: server.url, "PYTHONPATH": str(REPO_ROOT)}
        command = ("-m", "celery", "-A", f"{TARGETS}:app", "agboss", "checklist")
        adapter = ("--adapter", f"{TARGETS}:stripe_on_fake")
        done = run_python(*command, *adapter, env=env, timeout=120)
        assert "checklist passed" in done.stdout
        assert len(server.gateway.payments) >= 4, "the probes made real requests"
