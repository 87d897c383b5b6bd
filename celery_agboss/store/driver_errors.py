"""Driver exceptions become store exceptions here, and nowhere else.

Above the store, code reasons about three cases: the store could not be reached
or the connection broke (the write may or may not have committed: re-read),
a row stayed locked past the lock timeout (or, on SQLite, a fenced transaction held
the write lock past its bound and was rolled back), and anything else. A driver error a
framework re-raised as its own (Django's ORM, inside a fenced effect) is decided here too,
by the driver's error it wraps (``driver_error``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import exc as sa_exc

from celery_agboss.errors import StoreError, StoreLockTimeoutError, StoreUnavailableError
from celery_agboss.store.sqlite_watch import (
    FencedTransactionEndedError,
    FencedTransactionInterruptedError,
    FencedWatch,
)

# SQLSTATE classes and codes (PostgreSQL appendix A). The server's own trouble —
# insufficient resources (53: a full disk, out of memory, too many connections), a
# system or I/O error (58), an internal error or corruption (XX) — is the store's, not
# the application's: inside a fenced effect's fn it must stop the delivery (retried),
# never fail the execution and run its undos over a disk that filled for a moment.
_UNAVAILABLE_CLASSES = ("08", "53", "58", "XX")
_UNAVAILABLE_CODES = frozenset({"57P01", "57P02", "57P03"})
# A lock timeout, and a transaction the server rolled back to break a deadlock or a
# serialization conflict (40): nothing of it committed, and a retry may go through.
_LOCK_TIMEOUT_CODES = frozenset({"55P03"})
_ROLLED_BACK_CLASSES = ("40",)
# SQLite's primary result codes for the same kinds of trouble: NOMEM, READONLY, IOERR,
# CORRUPT, FULL, CANTOPEN, PROTOCOL, NOTADB (its extended codes keep these low bits).
_SQLITE_UNAVAILABLE = frozenset({7, 8, 10, 11, 13, 14, 15, 26})
_SQLITE_LOCKED = frozenset({5, 6})  # BUSY, LOCKED
_SQLITE_UNAVAILABLE_TEXT = (
    "unable to open",
    "disk i/o",
    "disk is full",
    "readonly database",
    "malformed",
    "not a database",
    "out of memory",
)

DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    psycopg.Error,
    sqlite3.Error,
)


def driver_error(error: BaseException) -> BaseException | None:
    """The driver's own error in ``error``: itself, or the one a framework wrapped.

    Django's ORM re-raises a driver error as its own ``django.db.Error`` (the driver's
    as ``__cause__``): a lock timeout of an ORM write in a fenced effect's ``fn`` is the
    store's trouble as much as the same one on the store's connection. Django is looked
    up only if already imported: without it no such wrapper exists."""
    if isinstance(error, DRIVER_ERRORS):
        return error
    django_utils = sys.modules.get("django.db.utils")
    wrapper = getattr(django_utils, "Error", None)
    if isinstance(wrapper, type) and isinstance(error, wrapper):
        cause = error.__cause__
        if isinstance(cause, DRIVER_ERRORS):
            return cause
    return None


def translate(error: BaseException) -> StoreError:
    """The store exception for a driver exception (its cause kept as ``__cause__``)."""
    original: BaseException = error
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return StoreUnavailableError(f"store connection lost: {_short(error.orig)}")
        original = error.orig if error.orig is not None else error
    if isinstance(error, (sa_exc.TimeoutError, sa_exc.DisconnectionError)):
        return StoreUnavailableError(f"store unavailable: {_short(error)}")
    if isinstance(original, psycopg.Error):
        return _from_psycopg(original)
    if isinstance(original, sqlite3.Error):
        return _from_sqlite(original)
    if isinstance(error, sa_exc.InterfaceError):
        return StoreUnavailableError(f"store unavailable: {_short(original)}")
    return StoreError(f"store error: {_short(original)}")


def _from_psycopg(error: psycopg.Error) -> StoreError:
    code = error.sqlstate or ""
    if code in _LOCK_TIMEOUT_CODES:
        return StoreLockTimeoutError(f"lock timeout: {_short(error)}")
    if code.startswith(_ROLLED_BACK_CLASSES):
        return StoreLockTimeoutError(f"rolled back by the server: {_short(error)}")
    if code.startswith(_UNAVAILABLE_CLASSES) or code in _UNAVAILABLE_CODES:
        return StoreUnavailableError(f"store unavailable: {_short(error)}")
    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)) and not code:
        # No SQLSTATE: the server never answered (connection refused, closed, reset).
        return StoreUnavailableError(f"store unavailable: {_short(error)}")
    return StoreError(f"store error: {_short(error)}")


def _from_sqlite(error: sqlite3.Error) -> StoreError:
    # The watchdog's own errors carry the whole story (and the advice) in their message.
    if isinstance(error, FencedTransactionInterruptedError):
        return StoreLockTimeoutError(str(error))
    if isinstance(error, FencedTransactionEndedError):
        return StoreError(str(error))
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None:
        # SQLite's own result code decides: an application's query whose message merely
        # says "malformed" (its JSON) or names a table "…busy…" is no store trouble.
        primary = code & 0xFF
        locked = primary in _SQLITE_LOCKED
        unavailable = primary in _SQLITE_UNAVAILABLE
    else:  # an error raised without a code (Python before 3.11, or made by hand)
        text = str(error).lower()
        locked = "database is locked" in text or "database table is locked" in text
        locked = locked or "busy" in text
        unavailable = any(words in text for words in _SQLITE_UNAVAILABLE_TEXT)
    if locked:
        return StoreLockTimeoutError(f"lock timeout: {_short(error)}")
    if unavailable or isinstance(error, sqlite3.InterfaceError):
        return StoreUnavailableError(f"store unavailable: {_short(error)}")
    return StoreError(f"store error: {_short(error)}")


def _short(error: BaseException | None) -> str:
    if error is None:
        return "unknown"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


@contextmanager
def translated() -> Iterator[None]:
    """Run a block of store code; driver exceptions leave it as store exceptions."""
    try:
        yield
    except Exception as error:
        driver = driver_error(error)
        if driver is None:
            raise
        raise translate(driver) from error


def raise_if_store_trouble(error: BaseException) -> None:
    """A driver error from code run inside the transaction (a fenced effect's ``fn``,
    Django's ORM's wrapped ones included): a lost connection or a lock timeout is the
    store's trouble and is raised as such; any other (an ``IntegrityError`` of the
    application's own insert) stays the application's exception, unchanged."""
    driver = driver_error(error)
    if driver is not None:
        translated_error = translate(driver)
        if isinstance(translated_error, (StoreUnavailableError, StoreLockTimeoutError)):
            raise translated_error from error


def raise_interrupted(watch: FencedWatch, error: BaseException) -> None:
    """The watchdog rolled the transaction back: say so, whatever the code inside it
    raised on finding out (its own exception stays the cause). Signals and
    ``KeyboardInterrupt`` pass unchanged, and so does a store error already raised."""
    if isinstance(error, Exception) and not isinstance(error, StoreError):
        raise translate(watch.error()) from error


def quietly(action: Callable[[], object]) -> None:
    """Rollback/close while another exception is already on its way: never mask it."""
    with contextlib.suppress(*DRIVER_ERRORS):
        action()
