"""How a ``PaymentTask`` is declared: bound, acks late, rejected on a lost worker."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, shared_task
from celery import _state as celery_state

from celery_agboss import AGBoss, ConfigurationError, PaymentTask
from celery_agboss.signals import disconnect


@pytest.fixture(autouse=True)
def no_leftover_shared_tasks() -> Iterator[None]:
    """``shared_task`` registers a constructor run by every app's finalize, process-wide:
    take this test's out again, so a refused declaration cannot break later tests."""
    before = set(celery_state._on_app_finalizers)
    yield
    celery_state._on_app_finalizers.intersection_update(before)


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("declaration", broker="memory://", set_as_current=False)
    app.conf.update(
        agboss_database_url="sqlite:////tmp/agboss-declaration-never-opened.db",
        agboss_pseudonym_key="a-pseudonym-key-of-enough-bytes",
        agboss_sweep_interval=0,
    )
    AGBoss(app)
    yield app
    disconnect(AGBoss.of(app))
    app.close()


def test_an_unbound_payment_task_is_refused_naming_the_task_and_the_fix(app: Celery) -> None:
    with pytest.raises(ConfigurationError) as caught:

        @app.task(base=PaymentTask, name="shop.charge", shared=False, lazy=False)
        def charge(order_id: int) -> None: ...

    message = str(caught.value)
    assert "shop.charge" in message and "bind=True" in message


def test_bind_false_is_refused_as_well(app: Celery) -> None:
    def refund(order_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match="bind=True"):
        app.task(base=PaymentTask, bind=False, name="shop.refund", shared=False, lazy=False)(refund)


def test_a_lazily_declared_unbound_task_is_refused_when_the_app_is_finalized(
    app: Celery,
) -> None:
    @app.task(base=PaymentTask, name="shop.capture", shared=False)
    def capture(order_id: int) -> None: ...

    with pytest.raises(ConfigurationError, match=r"shop\.capture"):
        app.finalize()


def test_a_shared_unbound_task_is_refused_when_an_app_uses_it(app: Celery) -> None:
    def void(order_id: int) -> None: ...

    # Refused when the first app takes it: at declaration if another app of this
    # process is already finalized, else when this one finalizes.
    with pytest.raises(ConfigurationError, match=r"shop\.void"):
        shared_task(base=PaymentTask, name="shop.void")(void)
        app.finalize()


def test_a_bound_payment_task_acks_late_and_is_rejected_when_its_worker_is_lost(
    app: Celery,
) -> None:
    @app.task(base=PaymentTask, bind=True, name="shop.pay", shared=False, lazy=False)
    def pay(self: Any, order_id: int) -> None: ...

    assert isinstance(pay, PaymentTask)
    assert pay.acks_late is True
    assert pay.reject_on_worker_lost is True


def test_a_class_based_payment_task_with_a_run_method_is_accepted() -> None:
    class Charge(PaymentTask):
        name = "shop.class_charge"

        def run(self, order_id: int) -> int:
            return order_id

    assert Charge.acks_late and Charge.reject_on_worker_lost


def test_a_class_whose_run_is_a_staticmethod_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="bind=True"):

        class Charge(PaymentTask):
            name = "shop.static_charge"

            @staticmethod
            def run(order_id: int) -> int:
                return order_id


def test_payment_task_itself_is_abstract_and_registers_nothing(app: Celery) -> None:
    app.finalize()
    assert PaymentTask.abstract is True
    assert not any(isinstance(task, PaymentTask) for task in app.tasks.values())


def test_calling_a_payment_task_directly_is_refused(app: Celery) -> None:
    @app.task(base=PaymentTask, bind=True, name="shop.direct", shared=False, lazy=False)
    def direct(self: Any, order_id: int) -> int:
        return order_id

    with pytest.raises(ConfigurationError, match="runs only as a Celery task"):
        direct(1)


def test_the_body_verbs_outside_a_delivery_say_where_they_work(app: Celery) -> None:
    @app.task(base=PaymentTask, bind=True, name="shop.verbs", shared=False, lazy=False)
    def verbs(self: Any) -> None: ...

    with pytest.raises(ConfigurationError, match="only inside the task body"):
        verbs.fenced_effect("mark", lambda conn: None)
    assert verbs.last_outcome is None


def test_acks_late_can_still_be_set_per_task_and_a_warning_says_what_it_costs(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="celery_agboss"):

        @app.task(
            base=PaymentTask,
            bind=True,
            name="shop.early",
            acks_late=False,
            shared=False,
            lazy=False,
        )
        def early(self: Any) -> None: ...

    assert early.acks_late is False
    assert "PaymentTask shop.early has acks_late off" in caplog.text


def test_a_lost_worker_is_never_retried_by_celery_whatever_the_app_says(app: Celery) -> None:
    """Celery 5.7's ``task_retry_on_worker_lost`` would spend the body's own retries on
    crashes (and could end an execution FAILED); redelivery and the sweep recover it."""
    app.conf.task_retry_on_worker_lost = True

    @app.task(base=PaymentTask, bind=True, name="shop.lost", shared=False, lazy=False)
    def lost(self: Any) -> None: ...

    assert lost.retry_on_worker_lost is False
    assert lost.reject_on_worker_lost is True and lost.acks_late is True
