"""Throwaway databases for the benchmarks: a SQLite file in a temporary folder, or a
PostgreSQL database created for the run and always dropped, even on failure.

Both get the celery_agboss schema (``migrate``) and ``bench_payments``, the table
that the plain side writes with a plain INSERT and the celery_agboss side writes
inside a fenced effect: the same row, so the comparison is the protocol's cost.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, text
from sqlalchemy.engine import Engine, make_url

DEFAULT_POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
POSTGRES_ADMIN_ENV = "AGBOSS_BENCH_POSTGRES_URL"
DATABASE_PREFIX = "agboss_bench_"
CONNECT_TIMEOUT_SECONDS = 3

bench_metadata = MetaData()

bench_payments = Table(
    "bench_payments",
    bench_metadata,
    Column("ref", String(100), primary_key=True),
    Column("payment_id", String(100), nullable=False),
    Column("amount", Integer, nullable=False),
)


def postgres_admin_url() -> str:
    """Where to create throwaway databases (a role that may ``CREATE DATABASE``)."""
    return os.environ.get(POSTGRES_ADMIN_ENV, DEFAULT_POSTGRES_ADMIN_URL)


def _admin_engine(admin_url: str) -> Engine:
    return create_engine(
        admin_url,
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
        pool_pre_ping=False,
    )


def postgres_unreachable(admin_url: str) -> str | None:
    """Why PostgreSQL cannot be used (a one-line reason), or None when it can."""
    try:
        engine = _admin_engine(admin_url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return first[:200]
    return None


def postgres_version(admin_url: str) -> str:
    engine = _admin_engine(admin_url)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar_one())
    finally:
        engine.dispose()


def prepare(url: str) -> None:
    """The celery_agboss schema and the benchmark's own table."""
    from celery_agboss.store.databases import create_store_engine
    from celery_agboss.store.migrate import migrate

    migrate(url)
    engine = create_store_engine(url)
    try:
        bench_metadata.create_all(engine)
    finally:
        engine.dispose()


@contextmanager
def sqlite_database(folder: Path) -> Iterator[str]:
    """A fresh SQLite file in ``folder`` (the caller's temporary folder removes it)."""
    path = (folder / f"bench-{uuid.uuid4().hex[:8]}.db").resolve()
    url = f"sqlite:///{path}"
    prepare(url)
    try:
        yield url
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


@contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """A database of this run on the server of ``admin_url``; dropped on the way out."""
    name = f"{DATABASE_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
    engine = _admin_engine(admin_url)
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
            prepare(url)
            yield url
        finally:
            with engine.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


__all__ = [
    "DATABASE_PREFIX",
    "bench_payments",
    "postgres_admin_url",
    "postgres_database",
    "postgres_unreachable",
    "postgres_version",
    "prepare",
    "sqlite_database",
]
