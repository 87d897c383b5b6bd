"""Records sealed at rest, as a user turns them on from docs/security.md on the README's
deployment.

The wheel goes into a fresh virtualenv with the page's own ``pip install`` line (its
``celery-agboss[crypto]`` the built wheel); a key is made with the page's own command
and given in the variable the page names; the page's ``python`` block is appended to the
README's ``shop.py``, with a user's task that charges with the customer's email in its
request and the customer's name in its arguments. The README's worker runs it. Then:
the SQLite file and its WAL hold neither; ``agboss show`` prints the request, read
through the key. The user rotates as the page says (a second key added last, then moved
first), runs ``agboss rotate-keys --json``, and every sealed value names the new key; an
order placed after the rotation is paid once, by a worker that reads both.

Redis and SQLite only (the brokers and stores are the recovery suite's business; both
stores' bytes are scanned in tests/delivery/test_sealed_at_rest.py); no speed-up.
"""

from __future__ import annotations

import base64
import shlex
import sqlite3
import subprocess
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import make_url

from celery_agboss.core.sealing import KeyRing, Sealer, key_variable
from tests.deployment import readme, venv
from tests.deployment.conftest import DeployFactory, venv_with_extras
from tests.deployment.deployment import Deployment
from tests.deployment.test_early_answer_deployed import _agboss, _json
from tests.deployment.venv import DeployedVenv
from tests.support.processes import wait_until

pytestmark = [pytest.mark.worker, pytest.mark.slow, pytest.mark.redis, pytest.mark.sqlite]

SECURITY_MD = Path(__file__).resolve().parents[2] / "docs" / "security.md"
EMAIL = "grace.hopper@example.test"
NAME = "Grace Hopper"
USER_TASK = """

@app.task(base=PaymentTask, bind=True)
def checkout(self, order_id, customer):
    receipt = self.outbound(charge, {"amount": 1000, "order": order_id, "email": customer["email"]},
                            business_key=f"order:{order_id}")
    return {"payment": receipt["id"], "customer": customer["name"]}
"""
PUBLISH = (
    "import sys\nfrom shop import checkout\n"
    "print('published', checkout.delay(int(sys.argv[1]), "
    f"{{'name': {NAME!r}, 'email': {EMAIL!r}}}).id)\n"
)
SETTLE_SECONDS = 60.0


def _page_blocks(lang: str) -> list[str]:
    blocks = readme.code_blocks(SECURITY_MD.read_text(encoding="utf-8"), lang)
    assert blocks, f"docs/security.md has no ```{lang} block"
    return blocks


@pytest.fixture(scope="session")
def crypto_venv(
    tmp_path_factory: pytest.TempPathFactory, deployed_venv: DeployedVenv
) -> DeployedVenv:
    """The wheel as docs/security.md installs it, in a fresh virtualenv."""
    root = venv_with_extras(tmp_path_factory, deployed_venv, "crypto")
    (line,) = [ln for ln in _page_blocks("sh")[0].splitlines() if ln.startswith("pip install")]
    argv = shlex.split(line.split("#", 1)[0])
    assert "celery-agboss[crypto]" in argv, line
    wheel = f"{deployed_venv.wheel}[crypto]"
    args = [wheel if a == "celery-agboss[crypto]" else a for a in argv[2:]]
    try:
        venv.run([str(root / "bin" / "pip"), "install", *args])
    except venv.BuildFailed as exc:
        pytest.fail(f"docs/security.md's pip install failed: {exc}", pytrace=False)
    return DeployedVenv(root, deployed_venv.wheel, frozenset(), frozenset())


def _new_key(deployment: Deployment) -> str:
    """A key made with the page's own command, in the deployment's python."""
    (line,) = [ln for ln in _page_blocks("sh")[0].splitlines() if ln.startswith("python -c")]
    code = shlex.split(line)[2]
    return deployment.run([str(deployment.venv.python), "-c", code], "new-key").strip()


def _keys_line() -> tuple[str, str]:
    """The page's settings line and the key name it sets."""
    (block,) = _page_blocks("python")
    line = block.strip().splitlines()[0]
    name = line.split('["', 1)[1].split('"', 1)[0]
    return line.split("#", 1)[0].rstrip(), name


def _files_at_rest(directory: Path) -> bytes:
    """The store's files as a backup copies them, read by another process: closing a
    descriptor of a SQLite file in this one would drop the locks its connections hold."""
    files = sorted(str(p) for p in directory.iterdir() if p.is_file())
    return subprocess.run(["cat", *files], check=True, capture_output=True, timeout=30).stdout


def _sealed_texts(database_url: str) -> dict[str, list[str]]:
    path = str(make_url(database_url).database)
    found: dict[str, list[str]] = {}
    with closing(sqlite3.connect(path)) as conn:
        for table, column in (
            ("agboss_executions", "args"),
            ("agboss_executions", "result"),
            ("agboss_outbound_calls", "request"),
            ("agboss_intent_history", "detail"),
        ):
            rows = conn.execute(f"SELECT {column} FROM {table} WHERE {column} IS NOT NULL")
            found[f"{table}.{column}"] = [str(row[0]) for row in rows]
    return found


def _paid(deployment: Deployment, order: int) -> str:
    output = deployment.run([str(deployment.venv.python), "-c", PUBLISH, str(order)], "publish")
    task_id = output.split("published ", 1)[1].split()[0]

    def completed() -> bool:
        record = deployment.execution(task_id)
        return record is not None and record.state.value == "COMPLETED"

    wait_until(completed, SETTLE_SECONDS, message=lambda: deployment.states([task_id]))
    payments = deployment.gateway.gateway.payments_for(deployment.key_of(order))
    assert len(payments) == 1, payments
    return task_id


def test_a_user_seals_the_shop_and_rotates_its_key(
    crypto_venv: DeployedVenv,
    redis_url_factory: Any,
    sqlite_url: str,
    deploy: DeployFactory,
) -> None:
    deployment = deploy(redis_url_factory(), sqlite_url, speedups={}, venv=crypto_venv)
    deployment.prepare()  # the README's shop.py and payments.py, migrated
    first_line, first = _keys_line()
    keys = {first: _new_key(deployment), "2027-01": _new_key(deployment)}
    deployment.speedups = {key_variable(name): value for name, value in keys.items()}
    shop = deployment.app_dir / "shop.py"
    readme_shop = shop.read_text(encoding="utf-8")
    shop.write_text(f"{readme_shop}\n{first_line}\n{USER_TASK}", encoding="utf-8")
    raw = {name: base64.b64decode(value) for name, value in keys.items()}
    deployment.store.sealer = Sealer(KeyRing([(first, raw[first])]))

    worker = deployment.start_worker()
    deployment.wait_ready(worker)
    task_id = _paid(deployment, 51)
    record = deployment.execution(task_id)
    assert record is not None and NAME in (record.result or "")
    at_rest = _files_at_rest(Path(str(make_url(sqlite_url).database)).parent)
    assert EMAIL.encode() not in at_rest and NAME.encode() not in at_rest
    shown = deployment.run(_agboss(deployment, "show", deployment.key_of(51)), "show")
    assert EMAIL in shown, shown

    # The page's rotation: the new key last everywhere, then first; then rotate-keys.
    for ring in ([first, "2027-01"], ["2027-01", first]):
        worker.terminate()
        listed = ", ".join(f'"{name}"' for name in ring)
        shop.write_text(
            f"{readme_shop}\napp.conf.agboss_encryption_keys = [{listed}]\n{USER_TASK}",
            encoding="utf-8",
        )
        worker = deployment.start_worker()
        deployment.wait_ready(worker)
    deployment.store.sealer = Sealer(KeyRing([(n, raw[n]) for n in ("2027-01", first)]))
    rotated = _json(deployment.run(_agboss(deployment, "rotate-keys", "--json"), "rotate-keys"))
    assert isinstance(rotated, dict) and rotated["complete"] is True, rotated
    assert rotated["sealing_key"] == "2027-01" and sum(rotated["resealed"].values()) > 0
    for where, values in _sealed_texts(sqlite_url).items():
        assert values and all(v.startswith("agbsealed:1:2027-01:") for v in values), where
    later = _paid(deployment, 52)
    for execution_id in (task_id, later):
        record = deployment.execution(execution_id)
        assert record is not None and NAME in (record.result or "")
