"""The brokers as the README app uses them: default queue names, so each test isolates
itself with a Redis database of its own or a throwaway RabbitMQ vhost.

RabbitMQ vhosts are made with ``rabbitmqctl`` (``add_vhost``, ``set_permissions``)
and deleted afterwards; one left by a killed run (its pid in the name is gone) is
deleted by :func:`delete_stale_vhosts`.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import redis
from kombu.connection import Connection

CTL_SECONDS = 60.0
VHOST_PREFIX = "agboss_deploy_"
TASK_QUEUE = "celery"  # the README app sets no queue: Celery's default
UNACKED_KEY = "unacked"  # kombu's Redis transport: messages delivered, not acked yet
_counter = itertools.count(1)


class RabbitmqctlUnavailable(RuntimeError):
    """``rabbitmqctl`` is missing or refused; the message says what to do."""


def _rabbitmqctl(*args: str) -> str:
    ctl = shutil.which("rabbitmqctl")
    if ctl is None:
        raise RabbitmqctlUnavailable(
            "rabbitmqctl is not on PATH: the deployment tests give each test a RabbitMQ vhost "
            "of its own (the README app uses the default queue names), which needs "
            "rabbitmqctl on the machine that runs RabbitMQ"
        )
    try:
        done = subprocess.run(
            [ctl, *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CTL_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RabbitmqctlUnavailable(
            f"rabbitmqctl {' '.join(args)} ran over {CTL_SECONDS:g}s"
        ) from None
    if done.returncode != 0:
        raise RabbitmqctlUnavailable(
            f"rabbitmqctl {' '.join(args)} exited with {done.returncode}: "
            f"{(done.stdout + done.stderr).decode(errors='replace').strip()}"
        )
    return done.stdout.decode(errors="replace")


def vhost_url(base_url: str, vhost: str) -> str:
    """``base_url`` (an ``amqp://`` URL) on ``vhost``."""
    return urlunsplit(urlsplit(base_url)._replace(path="/" + quote(vhost, safe="")))


def _pid_is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def delete_stale_vhosts() -> list[str]:
    """Delete the vhosts of runs whose process is gone."""
    listed = _rabbitmqctl("list_vhosts", "--quiet", "--no-table-headers", "name")
    stale = []
    for name in (line.strip() for line in listed.splitlines()):
        match = re.match(rf"^{VHOST_PREFIX}(\d+)_", name)
        if match and int(match.group(1)) != os.getpid() and _pid_is_gone(int(match.group(1))):
            _rabbitmqctl("delete_vhost", name)
            stale.append(name)
    return stale


@contextmanager
def rabbitmq_vhost(base_url: str) -> Iterator[str]:
    """A new vhost on the RabbitMQ of ``base_url``, its user allowed everything on it;
    yields its URL and deletes it (and every queue in it) afterwards."""
    name = f"{VHOST_PREFIX}{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    user = unquote(urlsplit(base_url).username or "guest")
    _rabbitmqctl("add_vhost", name)
    try:
        _rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
        yield vhost_url(base_url, name)
    finally:
        _rabbitmqctl("delete_vhost", name)


# --- what the tests do to the broker -------------------------------------------------


def queue_length(broker_url: str, queue: str = TASK_QUEUE) -> int:
    """Messages ready in ``queue`` (Redis list length, or RabbitMQ's message count)."""
    if broker_url.startswith("redis"):
        client = redis.Redis.from_url(broker_url, socket_timeout=5)
        try:
            return int(client.llen(queue))
        finally:
            client.close()
    with Connection(broker_url, connect_timeout=5) as connection:
        try:
            declared = connection.default_channel.queue_declare(queue, passive=True)
        except Exception:  # not declared yet: nothing in it
            return 0
        return int(declared.message_count)


def unacked_task_ids(broker_url: str) -> list[str]:
    """Redis only: the task ids of the messages kombu holds unacked (hidden until the
    visibility timeout passes)."""
    client = redis.Redis.from_url(broker_url, socket_timeout=5)
    try:
        entries = client.hvals(UNACKED_KEY)
    finally:
        client.close()
    ids = []
    for entry in entries:
        message = json.loads(entry)[0]
        ids.append(str(message.get("headers", {}).get("id")))
    return ids


def lose_every_message(broker_url: str) -> int:
    """What a broker restart without persistence does: Redis FLUSHDB of the broker
    database, RabbitMQ purge of the task queue. The number of task messages lost."""
    waiting = queue_length(broker_url)
    if broker_url.startswith("redis"):
        client = redis.Redis.from_url(broker_url, socket_timeout=5)
        try:
            client.flushdb()
        finally:
            client.close()
        return waiting
    with Connection(broker_url, connect_timeout=5) as connection:
        return int(connection.default_channel.queue_purge(TASK_QUEUE) or 0)


__all__ = [
    "RabbitmqctlUnavailable",
    "delete_stale_vhosts",
    "lose_every_message",
    "queue_length",
    "rabbitmq_vhost",
    "unacked_task_ids",
    "vhost_url",
]
