"""How the tests find their services (no service needed)."""

from __future__ import annotations

import pytest

from tests.support import services
from tests.support.redis_databases import redis_db_url
from tests.support.services import POSTGRES, RABBITMQ, REDIS


@pytest.mark.parametrize(
    ("service", "default"),
    [
        (POSTGRES, "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
        (REDIS, "redis://127.0.0.1:6379"),
        (RABBITMQ, "amqp://guest:guest@127.0.0.1:5672//"),
    ],
)
def test_an_unset_or_blank_variable_gives_the_default(
    service: services.Service, default: str
) -> None:
    assert services.resolve_url(service, {}) == default
    assert services.resolve_url(service, {service.env_var: "  "}) == default


def test_a_set_variable_wins_over_the_default() -> None:
    environ = {"AGBOSS_TEST_REDIS_URL": " redis://cache.internal:6390 "}
    assert services.resolve_url(REDIS, environ) == "redis://cache.internal:6390"
    assert services.resolve_url(POSTGRES, environ) == POSTGRES.default_url


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), ("", False), ("0", False), ("false", False), ("true", True), ("1", True)],
)
def test_ci_is_on_when_the_variable_says_so(value: str | None, expected: bool) -> None:
    environ = {} if value is None else {"CI": value}
    assert services.in_ci(environ) is expected


def test_host_and_port_fall_back_to_the_service_port() -> None:
    assert services.host_and_port("redis://example:7000/2", 6379) == ("example", 7000)
    assert services.host_and_port("amqp://guest:guest@rabbit//", 5672) == ("rabbit", 5672)
    assert services.host_and_port("postgresql+psycopg:///test", 5432) == ("127.0.0.1", 5432)


def test_a_sqlalchemy_url_becomes_a_libpq_url() -> None:
    assert (
        services.libpq_url("postgresql+psycopg://postgres@127.0.0.1:5432/test")
        == "postgresql://postgres@127.0.0.1:5432/test"
    )
    assert services.libpq_url("postgresql://u@h/d") == "postgresql://u@h/d"


def test_passwords_are_hidden_in_messages() -> None:
    assert services.redact("amqp://guest:secret@h:5672//") == "amqp://guest:***@h:5672//"
    assert services.redact("redis://127.0.0.1:6379") == "redis://127.0.0.1:6379"


def test_store_backends_default_to_all_and_can_be_narrowed() -> None:
    assert services.selected_backends({}) == ("sqlite", "postgresql")
    assert services.selected_backends({"AGBOSS_TEST_BACKENDS": "PostgreSQL"}) == ("postgresql",)
    with pytest.raises(ValueError, match="AGBOSS_TEST_BACKENDS"):
        services.selected_backends({"AGBOSS_TEST_BACKENDS": "mysql"})


def test_redis_test_databases_replace_the_path_of_the_base_url() -> None:
    assert redis_db_url("redis://127.0.0.1:6379", 3) == "redis://127.0.0.1:6379/3"
    assert redis_db_url("redis://:pw@h:6379/0", 15) == "redis://:pw@h:6379/15"


def test_an_unreachable_service_skips_and_names_its_variable() -> None:
    environ = {"AGBOSS_TEST_REDIS_URL": f"redis://127.0.0.1:{unused_port()}"}
    with pytest.raises(pytest.skip.Exception, match="AGBOSS_TEST_REDIS_URL"):
        services.require(REDIS, environ)


def test_an_unreachable_service_fails_under_ci() -> None:
    environ = {"AGBOSS_TEST_REDIS_URL": f"redis://127.0.0.1:{unused_port()}", "CI": "true"}
    with pytest.raises(pytest.fail.Exception, match="AGBOSS_TEST_REDIS_URL"):
        services.require(REDIS, environ)


def unused_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
