"""The broker and the store: checked before a run, cleaned of the run's queues after it.

A run's messages live only in its own queues and exchanges (``chaos.<run>``), so
pointed at a broker other apps use it consumes nothing of theirs; at the end those
queues, exchanges and (on Redis) the run's leftover unacked messages are deleted.
The store must be a database of its own: one holding tables or executions of
anything but the explorer is refused.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable

from sqlalchemy import create_engine, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from celery_agboss.chaos.options import CouldNotRun
from celery_agboss.chaos.shop import APP_MODULE, ShopConfig
from celery_agboss.runtime.settings import redact_url
from celery_agboss.store.schema_executions import executions

CONNECT_SECONDS = 5


def check_broker(url: str) -> None:
    """CouldNotRun, naming the broker and what to do, unless it answers."""
    from kombu.connection import Connection

    try:
        with Connection(url, connect_timeout=CONNECT_SECONDS) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=CONNECT_SECONDS)
    except Exception as exc:  # kombu raises whatever its transport does
        raise CouldNotRun(
            f"the broker {_redacted_broker(url)} does not answer ({type(exc).__name__}: {exc}); "
            "start it, or pass --broker redis://host:6379/<db> or amqp://user:password@host//"
        ) from None


def _redacted_broker(url: str) -> str:
    with contextlib.suppress(Exception):
        from kombu.utils.url import maybe_sanitize_url

        return str(maybe_sanitize_url(url))
    return url.split("@")[-1]


def check_store(url: str) -> None:
    """CouldNotRun unless the store answers and holds nothing but the explorer's own data."""
    engine = create_engine(
        url, connect_args={"connect_timeout": CONNECT_SECONDS} if _postgres(url) else {}
    )
    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            foreign = sorted(t for t in tables if not t.startswith(("agboss_", "chaos_orders_")))
            if foreign:
                raise CouldNotRun(
                    f"the store {redact_url(url)} holds other tables ({', '.join(foreign[:5])}"
                    f"{', …' if len(foreign) > 5 else ''}); give the explorer a database of "
                    "its own (e.g. CREATE DATABASE chaos) — it writes executions and tables there"
                )
            if "agboss_executions" in tables:
                other = conn.execute(
                    select(executions.c.task_name)
                    .where(~executions.c.task_name.startswith(f"{APP_MODULE}."))
                    .where(~executions.c.task_name.startswith("celery_agboss."))
                    .limit(1)
                ).first()
                if other is not None:
                    raise CouldNotRun(
                        f"the store {redact_url(url)} holds executions of {other[0]!r}: it is "
                        "an application's store; give the explorer a database of its own"
                    )
    except SQLAlchemyError as exc:
        raise CouldNotRun(
            f"the store {redact_url(url)} does not answer ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0]}); start it, or pass --database-url"
        ) from None
    finally:
        engine.dispose()


def _postgres(url: str) -> bool:
    return make_url(url).get_backend_name() == "postgresql"


def clean_broker(config: ShopConfig) -> list[str]:
    """Delete the run's queues and exchanges (and, on Redis, its unacked leftovers);
    what could not be cleaned, as text (never raises: the verdict matters more)."""
    from kombu.connection import Connection

    problems: list[str] = []
    queues = [config.queue, config.sweep_queue]
    control = config.control_exchange
    exchanges = [
        config.queue,
        config.sweep_queue,
        control,
        f"{control}.pidbox",
        f"reply.{control}.pidbox",
        config.event_exchange,
    ]
    try:
        with Connection(config.broker_url, connect_timeout=CONNECT_SECONDS) as conn:
            channel = conn.default_channel
            for queue in queues:
                with contextlib.suppress(Exception):
                    channel.queue_delete(queue)
            for exchange in exchanges:
                with contextlib.suppress(Exception):
                    channel.exchange_delete(exchange)
            if conn.transport_cls in ("redis", "rediss") or config.broker_url.startswith("redis"):
                _clean_redis(channel, config, exchanges)
    except Exception as exc:
        problems.append(f"could not clean the broker's chaos queues: {exc}")
    return problems


def _clean_redis(channel: object, config: ShopConfig, exchanges: Iterable[str]) -> None:
    """Redis keeps unacked messages of every queue in one hash: drop the run's, and the
    run's bindings and pidbox reply queues."""
    client = getattr(channel, "client", None)
    if client is None:
        return
    prefix = f"chaos.{config.run_id}"
    for tag, raw in client.hgetall("unacked").items():
        with contextlib.suppress(Exception):
            _, exchange, routing = json.loads(raw)[:3]
            if str(exchange).startswith(prefix) or str(routing).startswith(prefix):
                client.hdel("unacked", tag)
                client.zrem("unacked_index", tag)
    for exchange in exchanges:
        client.delete(f"_kombu.binding.{exchange}")
    for member in client.zrange("_kombu.binding_deadlines", 0, -1):  # kombu 5.7's expiries
        if prefix.encode() in (member if isinstance(member, bytes) else str(member).encode()):
            client.zrem("_kombu.binding_deadlines", member)
    for key in client.scan_iter(match=f"*{prefix}*", count=500):
        client.delete(key)


__all__ = ["check_broker", "check_store", "clean_broker"]
