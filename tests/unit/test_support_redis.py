"""Redis test databases: one per caller, flushed, leased across test runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from tests.support.redis_databases import LEASE_KEY, RedisDatabaseLeases, redis_db_url
from tests.support.services import REDIS, resolve_url


def test_each_call_gets_a_database_of_its_own(redis_url_factory: Callable[[], str]) -> None:
    first, second = redis_url_factory(), redis_url_factory()
    assert first != second
    with redis.Redis.from_url(first) as one, redis.Redis.from_url(second) as two:
        one.set("k", "first")
        assert two.get("k") is None


def test_a_leased_database_is_flushed_when_given_back(redis_url: str) -> None:
    base = resolve_url(REDIS)
    other_run = RedisDatabaseLeases(base)
    url = other_run.lease()
    number = int(url.rsplit("/", 1)[1])
    with redis.Redis.from_url(url) as client:
        client.set("left", "over")
        other_run.release_all()
        assert client.get("left") is None
    with redis.Redis.from_url(redis_db_url(base, 0)) as leases:
        assert leases.get(LEASE_KEY.format(number)) is None


def test_a_test_that_uses_redis_is_marked_redis(
    redis_url: str, request: pytest.FixtureRequest
) -> None:
    assert request.node.get_closest_marker("redis") is not None
