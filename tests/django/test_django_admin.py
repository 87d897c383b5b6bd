"""The admin of a Django project: the store's records, read-only, and the operator's
decisions one record at a time, each audited with the admin user as its actor.

The pages are served by the project itself (Django's test client in a process of the
project, and ``runserver`` for headless Chromium), over a real worker's records on
SQLite and PostgreSQL. Speed-ups: those of the Django shop (tests/support/django_harness.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import quote as url_quote

import pytest

from tests.conftest import ProcessFactory
from tests.support.browser import ARTIFACTS, headless_chromium, require_chromium, screenshot
from tests.support.django_harness import DjangoShop
from tests.support.django_project import REPOSITORY
from tests.support.processes import wait_until
from tests.support.throwaway import free_ports

pytestmark = [pytest.mark.worker, pytest.mark.redis, pytest.mark.slow]

CARD = "4242424242424242"

# Run in a process of the project: makes the test's users, then plays the requests of
# the spec in ADMIN_SPEC with Django's test client; prints each response's status, final
# path and text as JSON.
CLIENT = r"""
import json, os
import django
django.setup()
from django.contrib.auth.models import Permission, User
from django.test import Client

spec = json.loads(os.environ["ADMIN_SPEC"])
for name, perms in spec["users"].items():
    user, _ = User.objects.get_or_create(username=name, defaults={"is_staff": True})
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="agboss", codename__in=perms)
    )
out = []
for step in spec["requests"]:
    client = Client()
    client.force_login(User.objects.get(username=step["user"]))
    if step.get("data") is None:
        response = client.get(step["path"], follow=True)
    else:
        response = client.post(step["path"], step["data"], follow=True)
    out.append({
        "status": response.status_code,
        "path": response.request["PATH_INFO"],
        "text": response.content.decode(),
    })
print("RESPONSES" + json.dumps(out))
"""

VIEW = ["view_execution", "view_intent", "view_pause"]
DECIDE = [*VIEW, "cancel_execution", "unpark_execution", "resolve_intent", "answer_pause"]
USERS = {"viewer": VIEW, "alice": DECIDE}


def admin(
    shop: DjangoShop, *requests: dict[str, Any], env: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The admin's answers to ``requests`` (``user``, ``path``, ``data`` for a POST)."""
    spec = json.dumps({"users": USERS, "requests": list(requests)})
    process = shop.managed_process(
        [sys.executable, "-c", CLIENT],
        name="django-admin-client",
        env={**(env or shop.env), "ADMIN_SPEC": spec},
        cwd=REPOSITORY,
    )
    assert process.wait(120) == 0, process.describe()
    answers: list[dict[str, Any]] = json.loads(process.output().split("RESPONSES", 1)[1])
    return answers


def page(model: str, key: str | None = None, action: str = "change") -> str:
    """An admin URL, its key quoted as the admin quotes primary keys."""
    if key is None:
        return f"/admin/agboss/{model}/"
    quoted = "".join(f"_{ord(c):02X}" if c in ':/_#?;@&=+$,"[]<>%\n\\' else c for c in key)
    return f"/admin/agboss/{model}/{url_quote(quoted)}/{action}/"


def paid_and_paused(shop: DjangoShop) -> tuple[str, str, str]:
    """A card charged (its number in the task's arguments) and a payment paused."""
    shop.start()
    charged = shop.publish("charge_card", "o-1", 500, CARD)
    paused = shop.publish("wait_for_approval", "o-2")
    shop.wait_state(charged, "COMPLETED")
    shop.wait_state(paused, "PAUSED")
    key = shop.query(
        "SELECT idempotency_key FROM agboss_outbound_calls WHERE execution_id = :id", id=charged
    ).idempotency_key
    return charged, paused, key


def test_the_admin_shows_records_read_only_with_chains_verified_and_no_card_data(
    django_shop: DjangoShop,
) -> None:
    charged, paused, key = paid_and_paused(django_shop)
    stored = django_shop.query("SELECT args FROM agboss_executions WHERE id = :id", id=charged)
    assert CARD in stored.args, "the store keeps the task's arguments: a page showing them fails"
    pause_id = f"{paused}:approval"
    pages = [
        page("execution"),
        page("intent"),
        page("pause"),
        page("execution", charged),
        page("intent", key),
        page("pause", pause_id),
    ]
    answers = admin(django_shop, *({"user": "viewer", "path": p} for p in pages))
    for path, answer in zip(pages, answers, strict=True):
        assert answer["status"] == 200, (path, answer["text"][-2000:])
        assert CARD not in answer["text"] and CARD[-8:] not in answer["text"], path
        assert 'name="action"' not in answer["text"], f"a bulk action on {path}"
        assert "agboss-cancel" not in answer["text"], f"a decision form for a viewer: {path}"
    executions, intents, pauses, execution, intent, pause = (a["text"] for a in answers)
    assert charged in executions and paused in executions
    assert key in intents
    assert pause_id in pauses
    assert key in execution and "chain verified" in execution and "***" in execution
    assert "chain verified" in intent and "CHAIN BROKEN" not in intent
    assert paused in pause and "PENDING" in pause
    no_add = admin(django_shop, {"user": "viewer", "path": "/admin/agboss/execution/add/"})
    assert no_add[0]["status"] == 403

    # A history row changed in the database since it was written shows on the page.
    django_shop.query(
        "UPDATE agboss_intent_history SET detail = '{\"edited\": 1}' "
        "WHERE idempotency_key = :k AND seq = 1 RETURNING 1",
        k=key,
    )
    tampered = admin(django_shop, {"user": "viewer", "path": page("intent", key)})[0]["text"]
    assert "CHAIN BROKEN at row 1" in tampered


# Run in a process of the project: a delivery of an execution pauses with the payload in
# argv (stored as ``self.pause`` stores it), then releases; prints the execution's id.
PAUSE_ASKING = r"""
import sys
import django
django.setup()
from celery_agboss.testing.clock import VirtualClock
from celery_agboss.testing.gateway import FakeGateway
from tests.operations.world import make_world

store_url, payload = sys.argv[1:3]
clock = VirtualClock()
world = make_world(store_url, clock=clock, gateway=FakeGateway(clock=clock), published=[])
task_id = world.publish("o-9")
ctx = world.start(task_id)
with ctx.fenced() as tx:
    assert world.agboss.executions.pause_in(tx, "approval", payload) == (False, None)
assert ctx.settle_all_and_release()
world.close()
print("paused", task_id, flush=True)
"""


def test_a_pause_page_shows_what_the_pause_asks_escaped_above_its_answer_form(
    django_shop: DjangoShop,
) -> None:
    """Whoever answers a pause approves what it asks (docs/pauses.md): its page shows the
    payload as stored, as ``agboss show`` prints it, above the answer form; a payload
    that looks like HTML is shown as text, never run as markup."""
    payload = json.dumps(
        {"refund": 4999, "to": "customer 77", "note": "<script>alert('approved')</script>"}
    )
    argv = ["-c", django_shop.url, payload]
    output = django_shop.run(f"import sys; sys.argv = {argv!r}\n{PAUSE_ASKING}")
    pause_id = f"{output.split('paused ', 1)[1].split()[0]}:approval"
    (shown,) = admin(django_shop, {"user": "alice", "path": page("pause", pause_id)})
    text = shown["text"]
    assert shown["status"] == 200, text[-2000:]
    assert "What it asks" in text and "&quot;refund&quot;: 4999" in text, text[-3000:]
    assert "customer 77" in text
    assert "&lt;script&gt;alert(&#x27;approved&#x27;)&lt;/script&gt;" in text
    assert "<script>alert(" not in text, "the payload was rendered as markup"
    assert text.index('id="agboss-pause-asks"') < text.index('id="agboss-answer"'), (
        "what it asks comes before the form that answers it"
    )


def test_each_decision_needs_its_permission_and_is_audited_with_the_admin_user(
    django_shop: DjangoShop,
) -> None:
    charged, paused, key = paid_and_paused(django_shop)
    later = django_shop.run(
        "from tests.support.django_shop import tasks\n"
        "result = tasks.charge_order.apply_async(('o-3', 100), countdown=3600)\n"
        "print('published', result.id)\n"
    )
    later = later.split("published ", 1)[1].split()[0]
    pause_id = f"{paused}:approval"
    answer = {"answer": '{"approved": true}'}
    denied, answered, again, refused, not_parked, settled, cancelled = admin(
        django_shop,
        {"user": "viewer", "path": page("pause", pause_id, "answer"), "data": answer},
        {"user": "alice", "path": page("pause", pause_id, "answer"), "data": answer},
        {"user": "alice", "path": page("pause", pause_id, "answer"), "data": answer},
        {"user": "alice", "path": page("execution", charged, "cancel"), "data": {"reason": "x"}},
        {"user": "alice", "path": page("execution", charged, "unpark"), "data": {"reason": "x"}},
        {
            "user": "alice",
            "path": page("intent", key, "resolve"),
            "data": {"outcome": "not_sent", "reason": "checked"},
        },
        {"user": "alice", "path": page("execution", later, "cancel"), "data": {"reason": "gone"}},
    )
    assert denied["status"] == 403
    assert answered["status"] == 200 and "answered; its task goes on" in answered["text"]
    assert "Refused, nothing changed" in again["text"]
    assert "Refused, nothing changed" in refused["text"] and "COMPLETED" in refused["text"]
    assert "Refused, nothing changed" in not_parked["text"]
    assert "Refused, nothing changed" in settled["text"]
    assert f"Execution {later} is CANCELLED." in cancelled["text"]
    done = django_shop.wait_state(paused, "COMPLETED")
    assert done is not None
    audit = django_shop.query_all("SELECT actor, action, target FROM agboss_audit ORDER BY id")
    assert [(a.actor, a.action, a.target) for a in audit] == [
        ("django-admin:alice", "answer-pause", paused),
        ("django-admin:alice", "cancel", later),
    ]
    assert django_shop.execution(later).state == "CANCELLED"
    assert django_shop.execution(charged).state == "COMPLETED"


@pytest.mark.parametrize("django_backend", ["sqlite"], indirect=True)
def test_a_store_by_url_is_not_read_through_django_and_the_page_says_what_to_do(
    django_shop: DjangoShop,
) -> None:
    test = {**json.loads(django_shop.env["AGBOSS_DJANGO_TEST"]), "store_url": django_shop.url}
    env = {**django_shop.env, "AGBOSS_DJANGO_TEST": json.dumps(test)}
    for answer in admin(django_shop, {"user": "viewer", "path": page("execution")}, env=env):
        assert answer["status"] == 200
        assert "the store is agboss_database_url" in answer["text"]


@pytest.mark.parametrize("django_backend", ["sqlite"], indirect=True)
def test_headless_chromium_shows_an_execution_and_its_verified_intent(
    django_shop: DjangoShop, managed_process: ProcessFactory
) -> None:
    """The page a person sees, rendered by a browser, kept as a screenshot."""
    require_chromium("the Django admin's pages")
    charged, _, key = paid_and_paused(django_shop)
    admin(django_shop)  # makes the users
    (port,) = free_ports(1)
    server = managed_process(
        [
            sys.executable,
            "-m",
            "django",
            "runserver",
            f"127.0.0.1:{port}",
            "--noreload",
            "--insecure",
        ],
        name="django-runserver",
        env=django_shop.env,
        cwd=REPOSITORY,
    )
    base = f"http://127.0.0.1:{port}"
    wait_until(lambda: "Quit the server" in server.output(), 60, message=server.describe)
    url = f"{base}/browser-login/?user=viewer&next={url_quote(page('execution', charged))}"
    dom = headless_chromium(url, "--dump-dom")
    assert charged in dom and key in dom and "chain verified" in dom
    assert CARD not in dom
    screenshot(url, ARTIFACTS / "django-admin-execution.png")
