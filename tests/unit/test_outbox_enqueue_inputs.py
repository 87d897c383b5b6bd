"""``outbox.enqueue`` given both a ``key`` and a ``task_id`` refuses, naming both: each
names the row's task id on its own, and the key was silently ignored."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import signature
from sqlalchemy import create_engine
from sqlalchemy.engine import Connection

from celery_agboss import outbox
from celery_agboss.errors import ConfigurationError


@pytest.fixture
def conn() -> Iterator[Connection]:
    engine = create_engine("sqlite://")
    with engine.connect() as connection:
        yield connection
    engine.dispose()


def test_a_signature_with_a_task_id_and_a_key_is_refused(conn: Connection) -> None:
    sig = signature("shop.receipt", args=("o-1",)).set(task_id="t-1")
    with pytest.raises(ConfigurationError) as refused:
        outbox.enqueue(conn, sig, key="receipt:o-1")
    message = str(refused.value)
    assert "key='receipt:o-1'" in message and "task_id='t-1'" in message
    assert "Give one" in message


def test_a_task_id_in_the_options_and_a_key_is_refused(conn: Connection) -> None:
    with pytest.raises(ConfigurationError, match="task_id='t-2'"):
        outbox.enqueue(conn, "shop.receipt", ["o-2"], options={"task_id": "t-2"}, key="k")
