"""Where the test services are, and whether they answer.

Each service is found through one environment variable (with a default that
matches a developer machine). A service that does not answer skips the tests
that need it, naming the variable to set; under CI (``CI`` set) it fails them.

``python -m tests.support.services`` checks all three and, under CI, exits
non-zero when one does not answer (``make check-services``).
"""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

CONNECT_TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True)
class Service:
    """A service the tests can talk to, and how it is found."""

    name: str
    env_var: str
    default_url: str
    default_port: int


POSTGRES = Service(
    name="PostgreSQL",
    env_var="AGBOSS_TEST_POSTGRES_URL",
    default_url="postgresql+psycopg://postgres@127.0.0.1:5432/test",
    default_port=5432,
)
REDIS = Service(
    name="Redis",
    env_var="AGBOSS_TEST_REDIS_URL",
    default_url="redis://127.0.0.1:6379",
    default_port=6379,
)
RABBITMQ = Service(
    name="RabbitMQ",
    env_var="AGBOSS_TEST_RABBITMQ_URL",
    default_url="amqp://guest:guest@127.0.0.1:5672//",
    default_port=5672,
)
SERVICES = (POSTGRES, REDIS, RABBITMQ)

BACKENDS_ENV_VAR = "AGBOSS_TEST_BACKENDS"
KNOWN_BACKENDS = ("sqlite", "postgresql")


def environ_or(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def resolve_url(service: Service, environ: Mapping[str, str] | None = None) -> str:
    """The service's URL: its variable when set and not blank, else the default."""
    value = environ_or(environ).get(service.env_var, "").strip()
    return value or service.default_url


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``CI`` is set to anything but an empty, ``0`` or ``false`` value."""
    value = environ_or(environ).get("CI", "").strip().lower()
    return value not in ("", "0", "false", "no")


def selected_backends(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The store backends to test, from ``AGBOSS_TEST_BACKENDS`` (all by default)."""
    raw = environ_or(environ).get(BACKENDS_ENV_VAR, "").strip()
    if not raw:
        return KNOWN_BACKENDS
    names = tuple(dict.fromkeys(part.strip().lower() for part in raw.split(",") if part.strip()))
    unknown = [name for name in names if name not in KNOWN_BACKENDS]
    if unknown or not names:
        raise ValueError(
            f"{BACKENDS_ENV_VAR}={raw!r}: expected a comma-separated subset of "
            f"{', '.join(KNOWN_BACKENDS)}"
        )
    return names


def host_and_port(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (``postgresql+psycopg://``) as libpq reads it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"not a URL: {url!r}")
    return f"{scheme.split('+', 1)[0]}://{rest}"


def _tcp_error(host: str, port: int) -> str | None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_SECONDS):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port} ({exc})"


def _postgres_error(url: str) -> str | None:
    import psycopg

    try:
        with psycopg.connect(
            libpq_url(url), connect_timeout=int(CONNECT_TIMEOUT_SECONDS), autocommit=True
        ) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL handshake failed ({exc})"
    return None


def _redis_error(url: str) -> str | None:
    import redis

    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=CONNECT_TIMEOUT_SECONDS,
        socket_timeout=CONNECT_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"Redis PING failed ({exc})"
    finally:
        client.close()
    return None


def _rabbitmq_error(url: str) -> str | None:
    from kombu.connection import Connection

    conn = Connection(url, connect_timeout=CONNECT_TIMEOUT_SECONDS)
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
    except Exception as exc:  # a probe: any error (the transport's own ones too) means "no"
        return f"AMQP handshake failed ({type(exc).__name__}: {exc})"
    finally:
        conn.release()
    return None


_HANDSHAKES = {
    POSTGRES.name: _postgres_error,
    REDIS.name: _redis_error,
    RABBITMQ.name: _rabbitmq_error,
}


@functools.cache
def unreachable_reason(service: Service, url: str) -> str | None:
    """Why ``url`` does not answer (TCP connect, then a real handshake), or None."""
    host, port = host_and_port(url, service.default_port)
    return _tcp_error(host, port) or _HANDSHAKES[service.name](url)


def redact(url: str) -> str:
    """``url`` with its password, if any, replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def unavailable_message(service: Service, url: str, reason: str) -> str:
    return (
        f"{service.name} is not reachable at {redact(url)}: {reason}. "
        f"Start it, or point {service.env_var} at one."
    )


def require(service: Service, environ: Mapping[str, str] | None = None) -> str:
    """The service's URL, or skip the test (fail it under CI) when it does not answer."""
    url = resolve_url(service, environ)
    reason = unreachable_reason(service, url)
    if reason is None:
        return url
    message = unavailable_message(service, url, reason)
    if in_ci(environ):
        fail(message)
    pytest.skip(message)


def fail(message: str) -> NoReturn:
    pytest.fail(f"{message} (CI is set, so a missing service is an error)", pytrace=False)


def main() -> int:
    ci = in_ci()
    missing = 0
    for service in SERVICES:
        url = resolve_url(service)
        reason = unreachable_reason(service, url)
        if reason is None:
            print(f"{service.name}: ok ({redact(url)})")
        else:
            missing += 1
            print(f"{service.name}: {unavailable_message(service, url, reason)}")
    if missing and ci:
        print("CI is set: the tests need every service.", file=sys.stderr)
        return 1
    if missing:
        print("The tests that need a missing service will be skipped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
