"""Apply configuration: per-table publication semantics and the run-wide settings."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_provider_pglogical.exceptions import ApplyError

if TYPE_CHECKING:
    from airflow_provider_pglogical.staging.reader import RelationInfo

CONFLICT_POLICIES = ("upsert", "strict")
TOAST_POLICIES = ("fail", "reject_and_continue")
CASCADE_POLICIES = ("follow_source", "never")
ACTIONS = ("insert", "update", "delete", "truncate")
SCHEMA_CHANGE_POLICIES = ("follow", "fail")
# ``leaves`` of a partitioned table's entry: ``own`` (each leaf partition is applied by its own entry, under
# its own name: what a publication without publish_via_partition_root sends), or ``route_to_root`` (every
# leaf's changes go to this entry's target, as publish_via_partition_root would send them).
LEAF_POLICIES = ("own", "route_to_root")
# ``session_replication_role`` of the sessions that write a PostgreSQL target: ``origin`` (the server's default:
# the target's foreign keys and triggers fire) or ``replica`` (what a native subscriber's apply uses).
REPLICATION_ROLES = ("origin", "replica")


@dataclass(frozen=True)
class TableApplyConfig:
    """How one source table is applied.

    ``row_filter`` is a SQL boolean expression over source columns (NULL counts as false);
    ``columns`` a column list (None: all); ``target`` the target table (``schema.table`` or a bare
    name in ``public``; default: the source name); ``key_columns`` overrides the key used to
    compact and match rows (default: the target's primary key for REPLICA IDENTITY FULL sources,
    else the replica identity); ``actions`` the published actions (publish = '...');
    ``schema_changes`` whether a source schema change the target can follow losslessly is applied
    to the target (``follow``: ADD COLUMN, widening type changes) or stops the batch (``fail``).
    """

    row_filter: str | None = None
    columns: tuple[str, ...] | None = None
    target: str | None = None
    conflict: str = "upsert"
    unchanged_toast: str = "fail"
    truncate_cascade: str = "follow_source"
    key_columns: tuple[str, ...] | None = None
    actions: tuple[str, ...] = ACTIONS
    schema_changes: str = "follow"
    leaves: str = "own"
    # Set by ``ApplyConfig.routed`` on the config of a leaf routed to its ancestor's target: that ancestor.
    # Its TRUNCATE then empties only the leaf's rows there (by its staged partition constraint).
    partition_of: str | None = None

    def __post_init__(self) -> None:
        for name, value, allowed in (("conflict", self.conflict, CONFLICT_POLICIES),
                                     ("leaves", self.leaves, LEAF_POLICIES),
                                     ("schema_changes", self.schema_changes, SCHEMA_CHANGE_POLICIES),
                                     ("unchanged_toast", self.unchanged_toast, TOAST_POLICIES),
                                     ("truncate_cascade", self.truncate_cascade, CASCADE_POLICIES)):
            if value not in allowed:
                raise ApplyError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        unknown = set(self.actions) - set(ACTIONS)
        if unknown:
            raise ApplyError(f"unknown actions {sorted(unknown)}; allowed: {', '.join(ACTIONS)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TableApplyConfig:
        data = dict(data)
        for key in ("columns", "key_columns", "actions"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        try:
            return cls(**data)
        except TypeError as exc:
            raise ApplyError(f"invalid table apply config: {exc}") from exc


@dataclass(frozen=True)
class ApplyConfig:
    """One apply run: which slot's batches, from where, into which target.

    ``tables`` maps source ``schema.table`` to its config; when empty every staged table is
    applied with defaults (like a publication FOR ALL TABLES). Keys ``schema.*`` and ``*`` select
    every staged table of a schema / every staged table, exact names taking precedence, so tables
    added to the publication later are applied by the next run (``table_config``). The target DSN is never part of
    this object: it is read from the environment variable named ``dsn_env`` (or the 0600 file
    ``dsn_file``) so it never reaches a command line or a log.
    """

    slot: str
    staging_root: str
    tables: dict[str, TableApplyConfig] = field(default_factory=dict)
    dsn_env: str = "PGLOGICAL_TARGET_DSN"
    dsn_file: str | None = None
    max_batches: int | None = None
    progress_table: str = "pglogical_progress"
    rejects_table: str = "pglogical_rejects"
    write_partitions: int | None = None
    # Schema of the progress, rejects and staging tables; None: resolved per role (targets/postgres/bookkeeping_schema.py).
    bookkeeping_schema: str | None = None
    # ``REPLICATION_ROLES``: how a PostgreSQL target's sessions apply (targets/postgres/replication_role.py).
    session_replication_role: str = "origin"

    def __post_init__(self) -> None:
        if self.session_replication_role not in REPLICATION_ROLES:
            raise ApplyError(f"session_replication_role must be one of {', '.join(REPLICATION_ROLES)}, "
                             f"got {self.session_replication_role!r}")

    def table_config(self, source: str) -> TableApplyConfig | None:
        """The config of ``schema.table``: its own entry, else ``schema.*``, else ``*`` (like a publication's
        FOR TABLE / FOR TABLES IN SCHEMA / FOR ALL TABLES); None when none applies (the table is ignored).

        A wildcard entry never names a ``target``: each table it selects keeps its own name.
        """
        if not self.tables:
            return TableApplyConfig()
        found = self.tables.get(source) or self.tables.get(f"{source.partition('.')[0]}.*") or self.tables.get("*")
        if found is not None and found.target and source not in self.tables:
            raise ApplyError(f"the wildcard entry that selects {source} must not name a target")
        return found

    def routed(self, relations: Mapping[str, RelationInfo]) -> ApplyConfig:
        """This config plus an entry for every leaf partition among ``relations`` (a batch's staged
        relations) whose ancestor's named entry says ``leaves: route_to_root``: the ancestor's settings,
        its target, ``partition_of`` the ancestor. The top-most such ancestor wins (like pgoutput's
        ``publish_as_relid``); a leaf with a named entry of its own keeps it. Pure."""
        routing = {name: cfg for name, cfg in self.tables.items() if cfg.leaves == "route_to_root"}
        if not routing:
            return self
        added: dict[str, TableApplyConfig] = {}
        for source, rel in relations.items():
            if source in self.tables or not rel.partition_ancestors:
                continue
            root = next((a for a in reversed(rel.partition_ancestors) if a in routing), None)
            if root is not None:
                cfg = routing[root]
                added[source] = replace(cfg, target=cfg.target or root, leaves="own", partition_of=root)
        return replace(self, tables={**self.tables, **added}) if added else self

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ApplyConfig:
        data = dict(data)
        data["tables"] = {name: TableApplyConfig.from_dict(t)
                          for name, t in (data.get("tables") or {}).items()}
        try:
            return cls(**data)
        except TypeError as exc:
            raise ApplyError(f"invalid apply config: {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> ApplyConfig:
        return cls.from_dict(json.loads(text))
