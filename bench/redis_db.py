"""The benchmark's own Redis database: leased, flushed before and after, given back.

The test suite leases Redis databases 1–15 through keys in database 0 (``SET NX``
with an expiry, tests/support/redis_databases.py); the benchmark takes its
database the same way, so a test run and a benchmark never flush each other's
database. The one asked for (14 by default) is tried first, then the others.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import redis

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_ENV = "AGBOSS_BENCH_REDIS_URL"
LEASE_KEY = "agboss-test:db-lease:{}"  # the test suite's key, so both honour one lease
LEASE_SECONDS = 900
DATABASES = range(1, 16)


class NoRedisDatabase(RuntimeError):
    """Every Redis database 1–15 is leased by someone else."""


def redis_base_url() -> str:
    return os.environ.get(REDIS_ENV, DEFAULT_REDIS_URL)


def with_db(base_url: str, number: int) -> str:
    return urlunsplit(urlsplit(base_url)._replace(path=f"/{number}"))


def redis_unreachable(base_url: str) -> str | None:
    """Why Redis cannot be used (one line), or None."""
    client = redis.Redis.from_url(base_url, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    except Exception as exc:
        return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    finally:
        client.close()
    return None


def redis_version(base_url: str) -> str:
    client = redis.Redis.from_url(base_url, socket_timeout=3)
    try:
        return str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()


def _flush(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.flushdb()
    finally:
        client.close()


@contextmanager
def leased_database(base_url: str, preferred: int) -> Iterator[str]:
    """The URL of a Redis database this run holds alone, flushed; flushed and freed after."""
    token = f"bench:{os.getpid()}:{uuid.uuid4().hex}"
    leases = redis.Redis.from_url(with_db(base_url, 0), socket_timeout=5)
    order = [preferred, *(n for n in reversed(DATABASES) if n != preferred)]
    try:
        number = next(
            (n for n in order if leases.set(LEASE_KEY.format(n), token, nx=True, ex=LEASE_SECONDS)),
            None,
        )
        if number is None:
            raise NoRedisDatabase(NoRedisDatabase.__doc__)
        url = with_db(base_url, number)
        try:
            _flush(url)
            yield url
        finally:
            try:
                _flush(url)
            finally:
                key = LEASE_KEY.format(number)
                if leases.get(key) == token.encode():
                    leases.delete(key)
    finally:
        leases.close()


__all__ = [
    "NoRedisDatabase",
    "leased_database",
    "redis_base_url",
    "redis_unreachable",
    "redis_version",
    "with_db",
]
