"""``--json`` promises one JSON document, usage errors included: a bad ``--state`` or
``--batch-size 0`` (found by click before the command runs) printed click's text, so a
script parsing the output met a JSONDecodeError instead of ``{"error": {...}}``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner, Result

from celery_agboss import AGBoss, migrate
from celery_agboss.cli import agboss


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Celery]:
    url = f"sqlite:///{tmp_path}/s.db"
    migrate(url)
    app = Celery("cli-usage", broker="memory://", set_as_current=False)
    app.conf.update(agboss_database_url=url, agboss_pseudonym_key="x" * 32)
    runtime = AGBoss(app)
    yield app
    runtime.close()


def invoke(app: Celery, args: list[str]) -> Result:
    return CliRunner().invoke(agboss, args, obj=CLIContext(app=app, no_color=True, workdir=None))


@pytest.mark.parametrize(
    "args, says",
    [
        (["executions", "--state", "WAITING_OPRATOR"], "--state"),
        (["rotate-keys", "--batch-size", "0"], "--batch-size"),
        (["executions", "--no-such-option"], "--no-such-option"),
        (["no-such-command"], "no-such-command"),
    ],
)
def test_a_usage_error_under_json_is_the_json_failure(
    app: Celery, args: list[str], says: str
) -> None:
    result = invoke(app, [*args, "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.output)["error"]
    assert error["code"] == "usage"
    assert says in error["message"] and "--help" in error["message"]


def test_a_usage_error_without_json_stays_clicks_text(app: Celery) -> None:
    result = invoke(app, ["executions", "--state", "WAITING_OPRATOR"])
    assert result.exit_code == 2
    assert "Invalid value for '--state'" in result.output
    assert not result.output.lstrip().startswith("{")


def test_a_json_word_after_the_double_dash_is_no_json_option(app: Celery) -> None:
    result = invoke(app, ["executions", "--state", "NOPE", "--", "--json"])
    assert result.exit_code == 2
    assert not result.output.lstrip().startswith("{")
