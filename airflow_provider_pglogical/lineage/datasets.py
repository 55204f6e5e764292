"""OpenLineage dataset names (namespace, name) for what the pipeline reads and writes — no OpenLineage import.

Names follow the OpenLineage naming spec and the Airflow providers' own choices:

* PostgreSQL tables (source, and ``postgres`` targets): namespace ``postgres://host:port``, name
  ``database.schema.table`` — what ``apache-airflow-providers-postgres`` emits, so the same
  table is one node whichever operator touched it;
* staged change logs: the ``pglogical://`` Asset's conversion (namespace ``pglogical://<slot>``,
  name ``schema.table``), so Airflow Assets and lineage datasets agree;
* path-based targets (``delta``): the table's location, namespace ``file`` for local paths or
  ``scheme://bucket`` for object stores, name the path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit

from airflow_provider_pglogical.assets.pglogical import SCHEME as PGLOGICAL_SCHEME

DEFAULT_PORT = 5432


class DatasetName(NamedTuple):
    namespace: str
    name: str


def postgres_authority(host: str, port: int | str | None) -> str:
    """``host:port`` as the providers write it (default port 5432 spelled out)."""
    return f"{host}:{int(port) if port not in (None, '') else DEFAULT_PORT}"


def postgres_table(authority: str, database: str, qualified_name: str) -> DatasetName:
    """A PostgreSQL table: ``postgres://host:port`` + ``database.schema.table``."""
    schema, _, table = qualified_name.partition(".")
    return DatasetName(f"postgres://{authority}", f"{database}.{schema}.{table}")


def staged_table(slot: str, qualified_name: str) -> DatasetName:
    """The staged change log of one source table (same as its ``pglogical://`` Asset converts to)."""
    return DatasetName(f"{PGLOGICAL_SCHEME}://{slot}", qualified_name)


def path_location(uri: str) -> DatasetName:
    """A file or object-store location: ``file`` + absolute path, or ``scheme://bucket`` + key."""
    parts = urlsplit(uri)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme else uri
        return DatasetName("file", "/" + path.strip("/"))
    return DatasetName(f"{parts.scheme}://{parts.netloc}", parts.path.strip("/"))


def _postgres_target(table: str, info: dict[str, Any]) -> DatasetName:
    return postgres_table(info["authority"], info["database"], table)


def _delta_target(table: str, info: dict[str, Any]) -> DatasetName:
    # ``info["locations"][table]``: the table's own URI when the target resolved it, else the target root
    # with one directory per ``schema.table``.
    location = info.get("locations", {}).get(table) or f"{str(info['root']).rstrip('/')}/{table}"
    return path_location(location)


# One naming function per target kind: a new target registers its own.
TARGET_NAMING: dict[str, Callable[[str, dict[str, Any]], DatasetName]] = {
    "postgres": _postgres_target,
    "delta": _delta_target,
}


def target_table(kind: str, table: str, info: dict[str, Any]) -> DatasetName:
    """The dataset of one target table of a ``kind`` target; ``info`` holds what that kind needs
    (``postgres``: ``authority``, ``database``; ``delta``: ``root`` or ``locations``)."""
    try:
        naming = TARGET_NAMING[kind]
    except KeyError:
        raise ValueError(f"no OpenLineage naming for target kind {kind!r}") from None
    return naming(table, info)
