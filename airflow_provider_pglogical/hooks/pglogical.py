"""Airflow hook for pgoutput slots: an Airflow ``PostgresHook`` around ``PgLogicalClient``.

Every slot, publication and catalog operation lives in ``hooks/slot_client.py`` (plain psycopg2, no
Airflow); this hook resolves ``postgres_conn_id`` into the client's connections and forwards its
public API, so DAG authors keep using ``PgLogicalHook`` as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import psycopg2
import psycopg2.extensions
from airflow.providers.postgres.hooks.postgres import PostgresHook

from airflow_provider_pglogical.hooks.airflow_connection import hook_params
from airflow_provider_pglogical.hooks.dsn import ALLOWED_EXTRAS
from airflow_provider_pglogical.hooks.replication import ReplicationStream
from airflow_provider_pglogical.hooks.slot_client import (
    _LSN,
    APPLICATION_NAME,
    DEFAULT_PUBLISH,
    PLUGIN,
    PgLogicalClient,
    proto_version_for,
)
from airflow_provider_pglogical.hooks.slots import SlotInfo
from airflow_provider_pglogical.lsn import lsn_text


class PgLogicalHook(PostgresHook):
    """Manage and read pgoutput logical replication slots over the SQL interface.

    Reuses Airflow PostgreSQL connections (``postgres_conn_id``) or a plain libpq DSN
    (``PgLogicalHook.from_dsn``). One session per hook: admin statements run in autocommit;
    ``peek_changes``/``get_changes`` open a transaction for their server-side cursor. The work is
    done by ``self.client`` (a ``PgLogicalClient``), which code outside Airflow uses on its own.
    """

    conn_name_attr = "postgres_conn_id"
    default_conn_name = "postgres_default"
    conn_type = "postgres"
    hook_name = "PostgreSQL logical decoding (pgoutput)"

    def __init__(self, *args: Any, dsn: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dsn = dsn
        self.client = PgLogicalClient(dsn) if dsn is not None else PgLogicalClient(connect=self._connect)

    @classmethod
    def from_dsn(cls, dsn: str) -> PgLogicalHook:
        """A hook over a libpq DSN or URI, without an Airflow connection (tests, benchmarks)."""
        return cls(dsn=dsn)

    # -- session ---------------------------------------------------------------------------

    def get_conn(self) -> psycopg2.extensions.connection:
        """A new psycopg2 connection; Airflow connection extras are read from an allowlist."""
        conn = self.client.connect()
        self.conn = conn
        return conn

    def _connect(self) -> psycopg2.extensions.connection:
        # Credentials as PostgresHook resolves them (an IAM token when the connection asks for one).
        params = hook_params(self, application_name=APPLICATION_NAME)
        conn: psycopg2.extensions.connection = psycopg2.connect(**params)
        return conn

    @property
    def session(self) -> psycopg2.extensions.connection:
        """The client's session (autocommit, ``client_encoding`` = server encoding)."""
        return self.client.session

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> PgLogicalHook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the client's API, forwarded (docstrings on PgLogicalClient) --------------------------

    @property
    def server_version_num(self) -> int:
        return self.client.server_version_num

    @property
    def server_encoding(self) -> str:
        return self.client.server_encoding

    @property
    def proto_version(self) -> int:
        return self.client.proto_version

    def check_wal_level(self) -> None:
        self.client.check_wal_level()

    def check_replication_privilege(self) -> None:
        self.client.check_replication_privilege()

    def publication_exists(self, name: str) -> bool:
        return self.client.publication_exists(name)

    def create_publication(self, name: str, tables: Sequence[str | tuple[str, str]] | None = None, *,
                           all_tables: bool = False, publish: Sequence[str] = DEFAULT_PUBLISH,
                           schemas: Sequence[str] = ()) -> bool:
        return self.client.create_publication(name, tables, all_tables=all_tables, publish=publish, schemas=schemas)

    def published_tables(self, publications: str | Sequence[str]) -> set[str]:
        return self.client.published_tables(publications)

    def drop_publication(self, name: str) -> None:
        self.client.drop_publication(name)

    def slot_info(self, name: str) -> SlotInfo | None:
        return self.client.slot_info(name)

    def require_slot(self, name: str) -> SlotInfo:
        return self.client.require_slot(name)

    def create_slot(self, name: str) -> bool:
        return self.client.create_slot(name)

    def drop_slot(self, name: str) -> None:
        self.client.drop_slot(name)

    def drop_slot_if_exists(self, name: str) -> bool:
        return self.client.drop_slot_if_exists(name)

    def advance_slot(self, name: str, lsn: int | str) -> int:
        return self.client.advance_slot(name, lsn)

    def current_wal_flush_lsn(self) -> int:
        return self.client.current_wal_flush_lsn()

    def load_type_catalog(self, oids: Sequence[int]) -> Any:
        return self.client.load_type_catalog(oids)

    def format_types(self, pairs: Sequence[tuple[int, int]]) -> list[str | None]:
        return self.client.format_types(pairs)

    def missing_values(self, relid: int) -> dict[str, str]:
        return self.client.missing_values(relid)

    def partition_info(self, relid: int) -> tuple[tuple[str, ...], str | None]:
        return self.client.partition_info(relid)

    def primary_key(self, relid: int) -> tuple[str, ...]:
        return self.client.primary_key(relid)

    def partition_leaves(self, table: str) -> list[str]:
        return self.client.partition_leaves(table)

    def try_lock_slot(self, name: str) -> bool:
        return self.client.try_lock_slot(name)

    def unlock_slot(self, name: str) -> None:
        self.client.unlock_slot(name)

    def peek_changes(self, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None = None,
                     upto_nchanges: int | None = None, streaming: bool = False,
                     itersize: int = 2000) -> Iterator[tuple[int, int, bytes | memoryview]]:
        return self.client.peek_changes(slot, publication, upto_lsn=upto_lsn, upto_nchanges=upto_nchanges,
                                        streaming=streaming, itersize=itersize)

    def get_changes(self, slot: str, publication: str | Sequence[str], *, upto_lsn: int | str | None = None,
                    upto_nchanges: int | None = None, streaming: bool = False,
                    itersize: int = 2000) -> Iterator[tuple[int, int, bytes | memoryview]]:
        return self.client.get_changes(slot, publication, upto_lsn=upto_lsn, upto_nchanges=upto_nchanges,
                                       streaming=streaming, itersize=itersize)

    def stream_changes(self, slot: str, publication: str | Sequence[str], *, start_lsn: int, upto_lsn: int,
                       itersize: int = 2000) -> ReplicationStream:
        return self.client.stream_changes(slot, publication, start_lsn=start_lsn, upto_lsn=upto_lsn,
                                          itersize=itersize)

    def pgoutput_options(self, publication: str | Sequence[str], *, streaming: bool = False) -> list[str]:
        return self.client.pgoutput_options(publication, streaming=streaming)


__all__ = ["ALLOWED_EXTRAS", "PLUGIN", "PgLogicalClient", "PgLogicalHook", "SlotInfo", "_LSN", "lsn_text",
           "proto_version_for"]
