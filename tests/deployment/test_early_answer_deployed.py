"""An answer that beats its pause, as a user tries it from docs/pauses.md on the README's
deployment.

The README's ``shop.py`` gets a user's 3-D Secure task (authorise-and-charge through the
README's own ``charge`` call after ``self.pause("3ds", …, accept_early=True)``). The task
is published while no worker runs; the return page's answer comes first, through the
documented ``celery -A shop agboss answer-pause`` (exit 0, kept early), ``agboss pauses``
lists it ``EARLY``; then the README's worker starts, and the task takes the answer at its
pause and charges once, in its first delivery, with no operator; ``agboss show`` then
lists the pause with what it asked and its answer. A second answer (the webhook) is
refused with exit code 1.

Redis and SQLite only (the brokers and stores are the recovery suite's business);
no speed-up is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.deployment.conftest import DeployFactory
from tests.deployment.deployment import Deployment
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.redis, pytest.mark.sqlite]

USER_TASK = """

@app.task(base=PaymentTask, bind=True)
def checkout_3ds(self, order_id):
    answer = self.pause("3ds", {"order": order_id}, accept_early=True)
    receipt = self.outbound(charge, {"amount": 1000, "order": order_id},
                            business_key=f"order:{order_id}")
    return {"payment": receipt["id"], "answered_by": answer["source"]}
"""

PUBLISH = "from shop import checkout_3ds\nprint('published', checkout_3ds.delay(31).id)\n"
SETTLE_SECONDS = 60.0


def _json(output: str) -> object:
    """The JSON document a ``--json`` command printed (after any log line)."""
    return json.loads(output[output.index("{") :])


def _agboss(deployment: Deployment, *argv: str) -> list[str]:
    """``celery -A shop agboss …`` as the README's commands spell it."""
    migrate = deployment.commands.migrate  # [..., "-A", "shop", "agboss", "migrate"]
    return [*migrate[: migrate.index("agboss") + 1], *argv]


def test_a_return_page_answer_before_the_worker_runs_is_taken_at_the_pause(
    redis_url_factory: object,
    sqlite_url: str,
    deploy: DeployFactory,
) -> None:
    deployment = deploy(redis_url_factory(), sqlite_url)  # type: ignore[operator]
    deployment.prepare()
    shop = Path(deployment.app_dir) / "shop.py"
    shop.write_text(shop.read_text(encoding="utf-8") + USER_TASK, encoding="utf-8")
    output = deployment.run([str(deployment.venv.python), "-c", PUBLISH], "publish")
    task_id = output.split("published ", 1)[1].split()[0]
    pause_id = f"{task_id}:3ds"

    said = deployment.run(
        _agboss(deployment, "answer-pause", pause_id, '{"source": "return-page"}', "--json"),
        "answer-early",
    )
    assert _json(said) == {
        "pause_id": pause_id,
        "answered": True,
        "early": True,
        "republished": False,
    }
    listed = deployment.run(_agboss(deployment, "pauses", "--json"), "pauses")
    assert _json(listed) == {
        "pauses": [{"pause_id": pause_id, "execution": task_id, "status": "EARLY"}]
    }

    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    wait_until(
        lambda: (
            getattr(deployment.execution(task_id), "state", None) is not None
            and deployment.execution(task_id).state.value == "COMPLETED"
        ),  # type: ignore[union-attr]
        SETTLE_SECONDS,
        message=lambda: f"{task_id} to complete: {deployment.states([task_id])}",
    )
    record = deployment.execution(task_id)
    assert record is not None and record.deliveries == 1, "taken in its first delivery"
    assert len(deployment.gateway.gateway.payments_for(deployment.key_of(31))) == 1
    shown = _json(deployment.run(_agboss(deployment, "show", task_id, "--json"), "show"))
    (pause,) = shown["pauses"]  # type: ignore[index]
    assert (pause["pause_id"], pause["status"]) == (pause_id, "ANSWERED")
    assert (pause["payload"], pause["answer"]) == ({"order": 31}, {"source": "return-page"})

    webhook = deployment.start(
        _agboss(deployment, "answer-pause", pause_id, '{"source": "webhook"}'), "answer-again"
    )
    assert webhook.wait(60) == 1, webhook.describe()
    assert "already answered" in webhook.output()
