"""The rows of the sweep benchmark, written straight into the store's tables.

No worker and no store verb makes them: history is loaded in bulk, by ``INSERT …
SELECT`` from a temporary table of generated rows (PostgreSQL: ``generate_series``;
SQLite: a recursive CTE), shaped like what a finished execution leaves behind, so
that the sweep meets a realistic table:

- **terminal history**: ``COMPLETED`` (one in twenty ``FAILED``) executions, terminal
  at some point of the last six days (inside the default seven-day retention, so
  retention deletes nothing and must not read them either), each with its released
  lease, its intent (``COMPLETED``, or ``FAILED`` with the definite failure; the owner
  kept, as the store does) and, when completed, its fenced effect; one intent in a
  hundred was also used by another execution (``agboss_record_uses``); each completed
  one published its follow-up through the outbox (``agboss_outbox``, published). Intent
  history rows are left out: the sweep never reads them.
- **stranded work**: ``RUNNING`` executions whose holder died (an unreleased lease
  that expired a minute ago); every other one also left a ``PENDING`` intent owned by
  that dead lease, which the sweep reconciles before re-driving the execution.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.engine import Connection

TASK_NAME = "bench.sweep_charge"
CALL_NAME = "bench.sweep_charge"
HISTORY_SPAN_MS = 6 * 24 * 3600 * 1000  # inside the default seven-day retention
STRANDED_AGO_MS = 120_000  # when the dead delivery started
EXPIRED_AGO_MS = 60_000  # its lease ran out this long ago

_PG_NOW = "floor(extract(epoch from clock_timestamp()) * 1000)::bigint"

# One row per execution to make (g, its id, when it ended), in a temporary table (no
# WAL) that every INSERT below reads. The age spreads terminal times over the span.
_SERIES = {
    "postgresql": """CREATE TEMPORARY TABLE {table} ON COMMIT DROP AS
        SELECT g, md5(CAST(:prefix AS text) || g)::uuid::text AS id,
            {now} - ((g::bigint * 7919) % {span}) AS done, g % 20 = 0 AS failed
        FROM generate_series(1, CAST(:count AS integer)) AS g""",
    "sqlite": """CREATE TEMPORARY TABLE {table} AS
        WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < :count)
        SELECT g, :prefix || lower(hex(randomblob(16))) AS id,
            :now - ((g * 7919) % {span}) AS done, g % 20 = 0 AS failed
        FROM s""",
}

_TERMINAL = (
    """INSERT INTO agboss_executions (id, task_name, state, args, kwargs, options,
        requested_at_ms, started_at_ms, deliveries, result, error, terminal_at_ms,
        links_dispatched, updated_at_ms)
    SELECT id, :task, CASE WHEN failed THEN 'FAILED' ELSE 'COMPLETED' END,
        '["order-' || g || '"]', '{}', '{"queue":"payments"}', done - 2000, done - 1500, 1,
        CASE WHEN failed THEN NULL ELSE '{"id":"pay_' || g || '"}' END,
        CASE WHEN failed THEN '{"type":"CardDeclined"}' END, done, true, done
    FROM bench_rows""",
    """INSERT INTO agboss_leases (scope, holder, token, expires_at_ms, released,
        acquired_at_ms, renewed_at_ms)
    SELECT id, 'h' || g, 1, done + 30000, true, done - 1500, done - 1000 FROM bench_rows""",
    """INSERT INTO agboss_outbound_calls (idempotency_key, execution_id, name, fingerprint,
        request, result, result_stored, status, attempt, first_attempt_at_ms,
        attempt_started_at_ms, completed_at_ms, gateway_transaction_id, owner_scope,
        owner_holder, owner_token, failure, sent_by)
    SELECT 'bench:' || id || '\\:charge', id, :call, 'f' || g,
        '{"amount"\\:1000,"order":"order-' || g || '"}',
        CASE WHEN failed THEN 'null' ELSE '{"id":"pay_' || g || '"}' END, NOT failed,
        CASE WHEN failed THEN 'FAILED' ELSE 'COMPLETED' END, 1, done - 1400, done - 1400,
        CASE WHEN failed THEN NULL ELSE done - 1200 END,
        CASE WHEN failed THEN NULL ELSE 'pay_' || g END, id, 'h' || g, 1,
        CASE WHEN failed THEN '{"type":"CardDeclined"}' END, id
    FROM bench_rows""",
    """INSERT INTO agboss_fenced_effects (key, execution_id, name, result, token,
        created_at_ms)
    SELECT 'bench:' || id || '\\:mark-paid', id, 'mark-paid', '"pay_' || g || '"', 1,
        done - 1100 FROM bench_rows WHERE NOT failed""",
    # Each completed one published its follow-up (the shipping) through the outbox: the
    # published rows the outbox's retention keeps, which its claim must not read.
    """INSERT INTO agboss_outbox (task_id, task_name, args, kwargs, options, execution_id,
        created_at_ms, publish_after_ms, published_at_ms)
    SELECT 'ship-' || id, 'bench.ship', '["order-' || g || '"]', '{}', '{}', id,
        done - 1100, done - 1100, done - 900 FROM bench_rows WHERE NOT failed""",
    # One intent in a hundred was replayed by the next execution (a duplicate publish).
    """INSERT INTO agboss_record_uses (kind, record_key, execution_id, used_at_ms)
    SELECT 'intent', 'bench:' || a.id || '\\:charge', b.id, b.done
    FROM bench_rows AS a JOIN bench_rows AS b ON b.g = a.g + 1 WHERE a.g % 100 = 0""",
)

_STRANDED = (
    """INSERT INTO agboss_executions (id, task_name, state, args, kwargs, options,
        requested_at_ms, started_at_ms, deliveries, updated_at_ms)
    SELECT id, :task, 'RUNNING', '["order-' || g || '"]', '{}', '{"queue":"payments"}',
        :started - 1000, :started, 1, :started FROM bench_stranded""",
    """INSERT INTO agboss_leases (scope, holder, token, expires_at_ms, released,
        acquired_at_ms, renewed_at_ms)
    SELECT id, 'dead-' || g, 1, :expired, false, :started, :started FROM bench_stranded""",
    """INSERT INTO agboss_outbound_calls (idempotency_key, execution_id, name, fingerprint,
        request, result, status, attempt, owner_scope, owner_holder, owner_token,
        first_attempt_at_ms, attempt_started_at_ms, sent_by)
    SELECT 'bench:' || id || '\\:charge', id, :call, 'f' || g,
        '{"amount"\\:1000,"order":"order-' || g || '"}', 'null', 'PENDING', 1, id,
        'dead-' || g, 1, :started + 100, :started + 100, id
    FROM bench_stranded WHERE g % 2 = 0""",
)

_LOADED_TABLES = [
    "agboss_executions",
    "agboss_leases",
    "agboss_outbound_calls",
    "agboss_fenced_effects",
    "agboss_record_uses",
    "agboss_outbox",
]


@contextmanager
def _indexes_rebuilt_after(conn: Connection) -> Iterator[None]:
    """PostgreSQL: drop the loaded tables' keys and indexes, then rebuild them exactly
    as they were: a million random uuid keys go in far faster sorted in one build."""
    if conn.dialect.name != "postgresql":
        yield
        return
    tables = {"tables": _LOADED_TABLES}
    constraints = conn.execute(
        text(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
            " FROM pg_constraint WHERE contype IN ('p', 'u')"
            " AND conrelid::regclass::text = ANY(:tables)"
        ),
        tables,
    ).all()
    indexes = conn.execute(
        text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(:tables)"
            " AND indexname NOT IN (SELECT conname FROM pg_constraint)"
        ),
        tables,
    ).all()
    for name, _ in indexes:
        conn.exec_driver_sql(f'DROP INDEX "{name}"')
    for table, name, _ in constraints:
        conn.exec_driver_sql(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    yield
    conn.exec_driver_sql("SET LOCAL maintenance_work_mem = '256MB'")
    for table, name, definition in constraints:
        conn.exec_driver_sql(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
    for _, definition in indexes:
        conn.exec_driver_sql(definition.replace("%", "%%"))  # a LIKE in a partial index


def _series(conn: Connection, table: str, count: int, prefix: str, now_ms: int) -> None:
    backend = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
    statement = _SERIES[backend].format(table=table, now=_PG_NOW, span=HISTORY_SPAN_MS)
    conn.execute(text(statement), {"count": count, "prefix": prefix, "now": now_ms})


def _drop(conn: Connection, table: str) -> None:
    if conn.dialect.name != "postgresql":  # there it goes at commit
        conn.exec_driver_sql(f"DROP TABLE {table}")


def load_terminal(conn: Connection, count: int, now_ms: int, prefix: str = "t") -> None:
    """``count`` terminal executions with their lease, intent and effect rows, in the
    caller's transaction (``now_ms``: the database clock, SQLite only)."""
    with _indexes_rebuilt_after(conn):
        _series(conn, "bench_rows", count, prefix, now_ms)
        for insert in _TERMINAL:
            conn.execute(text(insert), {"task": TASK_NAME, "call": CALL_NAME})
        _drop(conn, "bench_rows")


def load_stranded(conn: Connection, count: int, now_ms: int, prefix: str) -> None:
    """``count`` RUNNING executions with an expired lease; every other one with a PENDING
    intent that lease owned. ``prefix`` keeps each batch's ids apart."""
    _series(conn, "bench_stranded", count, prefix, now_ms)
    values = {
        "task": TASK_NAME,
        "call": CALL_NAME,
        "started": now_ms - STRANDED_AGO_MS,
        "expired": now_ms - EXPIRED_AGO_MS,
    }
    for insert in _STRANDED:
        conn.execute(text(insert), values)
    _drop(conn, "bench_stranded")


__all__ = ["CALL_NAME", "TASK_NAME", "load_stranded", "load_terminal"]
