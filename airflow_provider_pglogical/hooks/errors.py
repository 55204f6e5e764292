"""Map PostgreSQL errors raised by slot and publication SQL to the provider's typed exceptions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2

from airflow_provider_pglogical.exceptions import (
    PrivilegeError,
    PublicationNotFoundError,
    ReplicationPermissionError,
    SlotActiveError,
    SlotInvalidatedError,
    SlotNotFoundError,
    WalLevelError,
)
from airflow_provider_pglogical.hooks.slots import SLOT_NAME_RE
from airflow_provider_pglogical.text import first_line

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


# What the server's "permission denied" messages mean in privileges (aclchk.c's messages).
_DENIED = re.compile(r"permission denied for (database|schema|table|relation|sequence|function) (.+)")
_OWNER = re.compile(r"must be owner of (table|relation|publication|schema|database) (.+)")
_FIX = {"database": "GRANT CREATE ON DATABASE {name} TO <role> (publications need it)",
        "schema": "GRANT USAGE, CREATE ON SCHEMA {name} TO <role>",
        "table": "GRANT SELECT ON {name} TO <role>", "relation": "GRANT SELECT ON {name} TO <role>",
        "sequence": "GRANT USAGE ON SEQUENCE {name} TO <role>", "function": "GRANT EXECUTE ON FUNCTION {name} TO <role>"}
_NEEDED = {"database": "CREATE ON DATABASE", "schema": "CREATE ON SCHEMA", "table": "SELECT ON TABLE",
           "relation": "SELECT ON TABLE", "sequence": "USAGE ON SEQUENCE", "function": "EXECUTE ON FUNCTION"}


def privilege_error(exc: psycopg2.Error) -> PrivilegeError:
    """A PrivilegeError naming the missing privilege of an insufficient_privilege (42501) error."""
    return _privilege_error(exc.diag.message_primary or str(exc).strip())


def _privilege_error(primary: str) -> PrivilegeError:
    if m := _DENIED.search(primary):
        kind, name = m.groups()
        privilege = f"{_NEEDED[kind]} {name}"
        return PrivilegeError(f"the role lacks {privilege} ({primary}); {_FIX[kind].format(name=name)}",
                              privilege=privilege)
    if m := _OWNER.search(primary):
        kind, name = m.groups()
        privilege = f"owner of {kind} {name}"
        hint = (" (adding a table to a publication needs its owner: create the publication as the owner and "
                "set source.create: false, or let the owner run it)") if kind in ("table", "relation") else ""
        return PrivilegeError(f"the role must be the {privilege} ({primary}){hint}", privilege=privilege)
    if "superuser" in primary:
        return PrivilegeError(f"the operation needs a superuser ({primary})", privilege="SUPERUSER")
    return PrivilegeError(f"insufficient privilege: {primary}", privilege="unknown")


def _text(exc: psycopg2.Error) -> str:
    diag = exc.diag
    return " ".join(p for p in (diag.message_primary, diag.message_detail, diag.message_hint) if p).lower() \
        or str(exc).lower()


def translate(exc: psycopg2.Error, *, slot: str | None = None, publication: str | None = None) -> Exception | None:
    """The typed exception for ``exc``, or None when it is not one we recognise."""
    return translate_state(exc.pgcode or "", _text(exc), primary=exc.diag.message_primary or str(exc).strip(),
                           slot=slot, publication=publication)


def translate_state(sqlstate: str, message: str, *, primary: str | None = None, slot: str | None = None,
                    publication: str | None = None) -> Exception | None:
    """The typed exception for an error given as its SQLSTATE and text (a replication connection's, which
    libpq reports as ``ERROR:  primary`` and further lines), or None when it is not one we recognise."""
    code = sqlstate
    text = message.lower()
    if primary is None:
        first = first_line(message, "")
        primary = re.sub(r"^(ERROR|FATAL|PANIC):\s+", "", first)
    if code == UNDEFINED_OBJECT and "replication slot" in text:
        return SlotNotFoundError(f"replication slot {slot!r} does not exist")
    if code == UNDEFINED_OBJECT and "publication" in text:
        name = primary or f"publication {publication!r} does not exist"
        return PublicationNotFoundError(f"{name}; create it (PgLogicalHook.create_publication) before reading")
    if code == OBJECT_IN_USE or "is active for pid" in text:
        return SlotActiveError(f"replication slot {slot!r} is in use: {primary}")
    if "invalidated" in text:
        return SlotInvalidatedError(f"replication slot {slot!r} has been invalidated")
    if "wal_level" in text:
        return WalLevelError(
            f"logical decoding needs wal_level=logical ({primary}); set it with "
            "ALTER SYSTEM SET wal_level = logical and restart the server"
        )
    if code == INSUFFICIENT_PRIVILEGE and "replication" in text:
        return ReplicationPermissionError(
            f"the role may not use replication slots ({primary}); grant it with "
            "ALTER ROLE ... REPLICATION (Amazon RDS: GRANT rds_replication TO ...)"
        )
    if code == INSUFFICIENT_PRIVILEGE:
        return _privilege_error(primary)
    if code == INVALID_NAME and "replication slot name" in text:
        return InvalidSlotNameError(primary)
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
