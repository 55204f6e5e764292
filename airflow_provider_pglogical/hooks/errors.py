"""Map PostgreSQL errors raised by slot and publication SQL to the provider's typed exceptions."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2

from airflow_provider_pglogical.exceptions import (
    PublicationNotFoundError,
    ReplicationPermissionError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotNotFoundError,
    WalLevelError,
)
from airflow_provider_pglogical.hooks.slots import SLOT_NAME_RE

# SQLSTATEs (src/backend/utils/errcodes.txt)
UNDEFINED_OBJECT = "42704"
OBJECT_IN_USE = "55006"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
INSUFFICIENT_PRIVILEGE = "42501"
INVALID_NAME = "42602"



class InvalidSlotNameError(ValueError):
    """A slot name PostgreSQL would reject; raised before any SQL runs."""


def validate_slot_name(name: str) -> str:
    """Return ``name`` if PostgreSQL accepts it as a replication slot name, else raise."""
    if not isinstance(name, str) or not SLOT_NAME_RE.fullmatch(name):
        raise InvalidSlotNameError(
            f"invalid replication slot name {name!r}: use 1-63 characters from a-z, 0-9 and '_' "
            "(PostgreSQL's rule for slot names)"
        )
    return name


def _text(exc: psycopg2.Error) -> str:
    diag = exc.diag
    return " ".join(p for p in (diag.message_primary, diag.message_detail, diag.message_hint) if p).lower() \
        or str(exc).lower()


def translate(exc: psycopg2.Error, *, slot: str | None = None, publication: str | None = None) -> Exception | None:
    """The typed exception for ``exc``, or None when it is not one we recognise."""
    code = exc.pgcode or ""
    text = _text(exc)
    if code == UNDEFINED_OBJECT and "replication slot" in text:
        return SlotNotFoundError(f"replication slot {slot!r} does not exist")
    if code == UNDEFINED_OBJECT and "publication" in text:
        name = exc.diag.message_primary or f"publication {publication!r} does not exist"
        return PublicationNotFoundError(f"{name}; create it (PgLogicalHook.create_publication) before reading")
    if code == OBJECT_IN_USE or "is active for pid" in text:
        return SlotActiveError(f"replication slot {slot!r} is in use: {exc.diag.message_primary}")
    if "invalidated" in text:
        return SlotInvalidatedError(f"replication slot {slot!r} has been invalidated")
    if "wal_level" in text:
        return WalLevelError(
            f"logical decoding needs wal_level=logical ({exc.diag.message_primary}); set it with "
            "ALTER SYSTEM SET wal_level = logical and restart the server"
        )
    if code == INSUFFICIENT_PRIVILEGE and "replication" in text:
        return ReplicationPermissionError(
            f"the role may not use replication slots ({exc.diag.message_primary}); grant it with "
            "ALTER ROLE ... REPLICATION"
        )
    if code == INVALID_NAME and "replication slot name" in text:
        return InvalidSlotNameError(exc.diag.message_primary)
    return None


@contextmanager
def translated_errors(*, slot: str | None = None, publication: str | None = None) -> Iterator[None]:
    """Re-raise recognised PostgreSQL errors as typed provider errors, chained to the original."""
    try:
        yield
    except psycopg2.Error as exc:
        typed = translate(exc, slot=slot, publication=publication)
        if typed is None:
            raise
        raise typed from exc
