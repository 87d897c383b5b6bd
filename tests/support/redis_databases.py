"""Redis databases 1–15, leased to one test at a time.

Leases are keys in database 0 (``SET NX`` with an expiry), so two test runs on
one Redis never share a database, and a run that was killed frees its leases
when they expire. A database is flushed when it is leased and when it is given
back.
"""

from __future__ import annotations

import os
import uuid
from urllib.parse import urlsplit, urlunsplit

import redis

LEASE_KEY = "agboss-test:db-lease:{}"
LEASE_SECONDS = 900
TEST_DATABASES = range(1, 16)


class NoFreeDatabase(RuntimeError):
    """Every Redis test database (1-15) is leased."""


def redis_db_url(base: str, number: int) -> str:
    """``base`` (a ``redis://`` URL) pointing at database ``number``."""
    return urlunsplit(urlsplit(base)._replace(path=f"/{number}"))


def flush(url: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.flushdb()
    finally:
        client.close()


class RedisDatabaseLeases:
    """Leases databases of the Redis at ``base_url``; :meth:`release_all` gives them back."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.token = f"{os.getpid()}:{uuid.uuid4().hex}"
        self.held: list[int] = []
        self._leases = redis.Redis.from_url(redis_db_url(base_url, 0), socket_timeout=5)

    def lease(self) -> str:
        """The URL of a database no one else holds, flushed."""
        for number in TEST_DATABASES:
            if self._leases.set(LEASE_KEY.format(number), self.token, nx=True, ex=LEASE_SECONDS):
                self.held.append(number)
                url = redis_db_url(self.base_url, number)
                flush(url)
                return url
        raise NoFreeDatabase(NoFreeDatabase.__doc__)

    def release_all(self) -> None:
        try:
            for number in self.held:
                flush(redis_db_url(self.base_url, number))
                key = LEASE_KEY.format(number)
                if self._leases.get(key) == self.token.encode():
                    self._leases.delete(key)
            self.held.clear()
        finally:
            self._leases.close()
