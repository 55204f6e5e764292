"""Spec validation: walk the raw document, report every problem with its key path, build the dataclasses."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF, SPARK_CONNECT_SCHEME
from airflow_provider_pglogical.exceptions import RowFilterError, SpecError
from airflow_provider_pglogical.hooks.sizes import parse_size
from airflow_provider_pglogical.hooks.storage_connection import OBJECT_STORE_SCHEMES
from airflow_provider_pglogical.pipeline.model import (
    ACTIONS,
    CONFLICT_POLICIES,
    DELTA_MODES,
    ENV_REF,
    ICEBERG_CATALOGS,
    ICEBERG_MODES,
    LEAF_POLICIES,
    NAMEDATALEN,
    REPLICATION_ROLES,
    SCHEMA_CHANGE_POLICIES,
    SECRET_OPTION,
    SLOT_NAME,
    TARGET_KINDS,
    TARGET_NAME,
    TOAST_POLICIES,
    TRUNCATE_CASCADE,
    NamedTarget,
    PipelineSpec,
    RetentionSpec,
    SnapshotSpec,
    SourceSpec,
    SparkSpec,
    StagingSpec,
    TableSpec,
    TargetSpec,
    TruncateSpec,
    union_tables,
)
from airflow_provider_pglogical.row_filter import fold_hint, parse_row_filter
from airflow_provider_pglogical.staging.drain import DRAIN_READS, drain_read

DURATION = re.compile(r"(\d+)\s*([smhdw]?)")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class SpecValidator:
    """Walks the raw document, records errors with their key path, builds the dataclasses."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.errors: list[str] = []

    def err(self, path: str, message: str) -> None:
        self.errors.append(f"{path}: {message}" if path else message)

    # -- generic helpers ----------------------------------------------------------------------

    def mapping(self, value: Any, path: str, allowed: tuple[str, ...],
                required: tuple[str, ...] = ()) -> dict[str, Any] | None:
        if value is None and not required:
            return {}
        if not isinstance(value, dict):
            self.err(path, f"expected a mapping, got {_kind(value)}")
            return None
        for key in value:
            if not isinstance(key, str):
                self.err(path, f"keys must be strings, got {_kind(key)}")
            elif key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else f" (allowed: {', '.join(allowed)})"
                self.err(_join(path, key), f"unknown key{hint}")
        for key in required:
            if key not in value:
                self.err(_join(path, key), "required key is missing")
        return value

    def string(self, value: Any, path: str, *, required: bool = False) -> str | None:
        if value is None:
            if required:
                self.err(path, "must not be empty")
            return None
        if not isinstance(value, str):
            self.err(path, f"expected a string, got {_kind(value)}")
            return None
        text = self.interpolate(value, path)
        if text is not None and not text.strip():
            self.err(path, "must not be empty")
            return None
        return text

    def interpolate(self, value: str, path: str) -> str | None:
        missing: list[str] = []

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in self.env:
                return self.env[name]
            if default is not None:
                return default
            missing.append(name)
            return ""

        out = ENV_REF.sub(sub, value)
        for name in missing:
            self.err(path, f"environment variable {name} is not set (use ${{{name}:-default}} for a default)")
        return None if missing else out

    def boolean(self, value: Any, path: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.err(path, f"expected true or false, got {_kind(value)}")
            return default
        return value

    def size(self, value: Any, path: str, *, positive: bool = True) -> int | None:
        if value is None:
            return None
        try:
            n = parse_size(value)
        except ValueError as exc:
            self.err(path, f"{exc}, got {_kind(value)}")
            return None
        if positive and n == 0:
            self.err(path, "must be greater than 0")
            return None
        return n

    def count(self, value: Any, path: str) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.err(path, f"expected a positive integer, got {_kind(value)}")
            return None
        if value <= 0:
            self.err(path, "must be greater than 0")
            return None
        return value

    def choice(self, value: Any, path: str, choices: tuple[str, ...], default: str) -> str:
        if value is None:
            return default
        if value not in choices:
            self.err(path, f"must be one of {', '.join(choices)}, got {value!r}")
            return default
        return str(value)

    def connection(self, raw: dict[str, Any], path: str) -> tuple[str | None, str | None]:
        dsn = self.string(raw.get("dsn"), _join(path, "dsn"))
        conn_id = self.string(raw.get("conn_id"), _join(path, "conn_id"))
        if "dsn" in raw and "conn_id" in raw:
            self.err(path, "give either dsn or conn_id, not both")
        elif "dsn" not in raw and "conn_id" not in raw:
            self.err(path, "one of dsn or conn_id is required")
        return dsn, conn_id

    # -- sections -----------------------------------------------------------------------------

    def pipeline(self, raw: Any, origin: str) -> PipelineSpec | None:
        top = self.mapping(raw, "", ("source", "staging", "target", "targets", "tables", "schemas", "truncate",
                                     "spark", "snapshot"), ("source", "staging"))
        if top is None:
            return None
        # A missing required section was reported by mapping(); do not report its keys too.
        source = self.source(top["source"], "source") if "source" in top else None
        staging = self.staging(top["staging"], "staging") if "staging" in top else None
        truncate = self.truncate(top.get("truncate"), "truncate")
        spark = self.spark(top.get("spark"), "spark")
        snapshot = self.snapshot(top.get("snapshot"), "snapshot")
        targets: dict[str, NamedTarget] = {}
        if "targets" in top:
            for key in ("target", "tables", "schemas"):
                if key in top:
                    self.err(key, "with targets:, each target has its own" + (" tables and schemas" if key != "target"
                                                                                else "; give one or the other"))
            targets = self.named_targets(top["targets"], "targets", snapshot)
            first = next(iter(targets.values()), None)
            target = first.target if first else None
            tables = union_tables([t.tables for t in targets.values()])
            selectors = union_tables([t.selectors for t in targets.values()])
        elif "target" not in top:
            self.err("target", "required key is missing (or targets:, docs/targets.md)")
            return None
        else:
            target, tables, selectors = self.selection(top, "", self.target(top["target"], "target"), snapshot)
        if self.errors or source is None or staging is None or target is None:  # a missing one was reported
            return None
        return PipelineSpec(source=source, staging=staging, target=target, tables=tables,
                            truncate=truncate, spark=spark, snapshot=snapshot, origin=origin, selectors=selectors,
                            targets=targets)

    def selection(self, raw: dict[str, Any], path: str, target: TargetSpec | None,
                  snapshot: SnapshotSpec) -> tuple[TargetSpec | None, dict[str, TableSpec], dict[str, TableSpec]]:
        """A target's ``tables:`` / ``schemas:`` (top-level for ``target:``, inside each of ``targets:``)."""
        selectors: dict[str, TableSpec] = {}
        if "tables" in raw:
            tables = self.tables(raw["tables"], _join(path, "tables"), selectors)
        elif "schemas" not in raw:
            self.err(_join(path, "tables"), "required key is missing")  # (or schemas:, docs/pipeline-spec.md)
            tables = {}
        else:
            tables = {}
        if "schemas" in raw:
            self.schemas(raw["schemas"], _join(path, "schemas"), selectors)
        if target is not None and target.kind in ("delta", "iceberg"):
            self.delta_tables(target, tables, selectors, path)
            if snapshot.initial and target.mode != "mirror":  # a change feed has no rows to start from
                self.err("snapshot.initial", f"a {target.kind} target loads snapshots in mode: mirror only (a "
                                             "changelog is a feed of changes); set snapshot.initial: false")
        return target, tables, selectors

    def named_targets(self, value: Any, path: str, snapshot: SnapshotSpec) -> dict[str, NamedTarget]:
        """``targets: {name: {kind: …, tables: …}}``: each target's settings beside its own selection."""
        if not isinstance(value, dict) or not value:
            self.err(path, f"expected a mapping of target names to targets, got {_kind(value)}")
            return {}
        out: dict[str, NamedTarget] = {}
        for name, body in value.items():
            where = _join(path, str(name))
            if not isinstance(name, str) or not TARGET_NAME.fullmatch(name):
                self.err(where, "a target name is 1-63 characters from a-z, 0-9 and '_', starting with a letter")
                continue
            if not isinstance(body, dict):
                self.err(where, f"expected a mapping, got {_kind(body)}")
                continue
            settings = {k: v for k, v in body.items() if k not in ("tables", "schemas")}
            target, tables, selectors = self.selection(body, where, self.target(settings, where), snapshot)
            if target is not None:
                out[name] = NamedTarget(target, tables, selectors)
        places: dict[tuple[str, ...], str] = {}
        for name, t in out.items():
            # Two targets at one place would share one watermark record per slot (SpecTarget.identity).
            place = (t.target.kind, t.target.dsn or t.target.conn_id or t.target.uri or "",
                     repr(sorted(t.target.catalog.items())), t.target.namespace or "")
            if place in places:
                self.err(_join(path, name), f"writes where targets.{places[place]} writes; each target needs a place "
                                            "of its own (another database, uri, catalog or namespace)")
            places.setdefault(place, name)
        return out

    def source(self, value: Any, path: str) -> SourceSpec | None:
        raw = self.mapping(value, path, ("dsn", "conn_id", "publication", "slot", "create", "max_batch_bytes",
                                         "max_changes", "max_lag_bytes", "min_safe_wal_bytes", "read"),
                           ("publication", "slot"))
        if raw is None:
            return None
        dsn, conn_id = self.connection(raw, path)
        publications: tuple[str, ...] = ()
        if isinstance(raw.get("publication"), list):
            publications = self.publications(raw["publication"], _join(path, "publication"))
            publication: str | None = publications[0] if publications else ""
            if len(raw["publication"]) > 1 and raw.get("create") is True:
                self.err(_join(path, "create"), "creates one publication; with several, create them yourself")
        else:
            publication = self.string(raw.get("publication"), _join(path, "publication"),
                                      required="publication" in raw)
        if publication is not None and len(publication.encode()) > NAMEDATALEN:
            self.err(_join(path, "publication"), f"longer than {NAMEDATALEN} bytes")
        slot = self.string(raw.get("slot"), _join(path, "slot"), required="slot" in raw)
        if slot is not None and not SLOT_NAME.fullmatch(slot):
            self.err(_join(path, "slot"), f"invalid replication slot name {slot!r}: use 1-63 characters "
                                          "from a-z, 0-9 and '_'")
        return SourceSpec(
            publication=publication or "", slot=slot or "", dsn=dsn, conn_id=conn_id,
            publications=publications if len(publications) > 1 else (),
            create=self.boolean(raw.get("create"), _join(path, "create"), False),
            max_batch_bytes=self.size(raw.get("max_batch_bytes"), _join(path, "max_batch_bytes")),
            max_changes=self.count(raw.get("max_changes"), _join(path, "max_changes")),
            max_lag_bytes=self.size(raw.get("max_lag_bytes"), _join(path, "max_lag_bytes"), positive=False),
            min_safe_wal_bytes=self.size(raw.get("min_safe_wal_bytes"), _join(path, "min_safe_wal_bytes"),
                                         positive=False),
            read=drain_read(self.choice(raw.get("read"), _join(path, "read"), DRAIN_READS, "sql")),
        )

    def publications(self, value: list[Any], path: str) -> tuple[str, ...]:
        """``publication: [a, b]``: decoded together like a subscription to several publications."""
        names: list[str] = []
        if not value:
            self.err(path, "expected a publication name or a non-empty list of them")
        for i, name in enumerate(value):
            if not isinstance(name, str) or not name.strip():
                self.err(f"{path}[{i}]", f"expected a publication name, got {_kind(name)}")
            elif "," in name or '"' in name:
                self.err(f"{path}[{i}]", "a publication name in a list cannot contain ',' or '\"'")
            elif len(name.encode()) > NAMEDATALEN:
                self.err(f"{path}[{i}]", f"longer than {NAMEDATALEN} bytes")
            elif name in names:
                self.err(f"{path}[{i}]", f"publication {name!r} is listed twice")
            else:
                names.append(name)
        return tuple(names)

    def staging(self, value: Any, path: str) -> StagingSpec | None:
        raw = self.mapping(value, path, ("uri", "conn_id", "retention"), ("uri",))
        if raw is None:
            return None
        uri = self.string(raw.get("uri"), _join(path, "uri"), required="uri" in raw)
        conn_id = self.string(raw.get("conn_id"), _join(path, "conn_id"), required="conn_id" in raw)
        if conn_id and uri and urlsplit(uri).scheme not in OBJECT_STORE_SCHEMES:
            self.err(_join(path, "conn_id"), "a staging connection is for an object-store uri (s3://, gs://, "
                                             "abfs://, az://)")
        retention = self.retention(raw["retention"], _join(path, "retention")) if "retention" in raw else None
        return StagingSpec(uri=uri or "", retention=retention, conn_id=conn_id)

    def retention(self, value: Any, path: str) -> RetentionSpec | None:
        raw = self.mapping(value, path, ("keep_batches", "keep_for"))
        if raw is None:
            return None
        keep_batches = self.count(raw.get("keep_batches"), _join(path, "keep_batches"))
        keep_for = self.duration(raw.get("keep_for"), _join(path, "keep_for"))
        if "keep_batches" not in raw and "keep_for" not in raw:
            self.err(path, "give keep_batches, keep_for or both (without retention every staged batch stays)")
        return RetentionSpec(keep_batches=keep_batches, keep_for_seconds=keep_for)

    def duration(self, value: Any, path: str) -> int | None:
        """``30m``, ``12h``, ``7d``, ``2w`` (or a number of seconds) as seconds, greater than 0."""
        if value is None:
            return None
        m = DURATION.fullmatch(str(value).strip()) if isinstance(value, str | int) and not isinstance(value, bool) \
            else None
        if m is None or int(m.group(1)) == 0:
            self.err(path, f"expected a duration greater than 0 such as 90m, 12h, 7d or 2w, got {value!r}")
            return None
        return int(m.group(1)) * DURATION_UNITS[m.group(2) or "s"]

    def target(self, value: Any, path: str) -> TargetSpec | None:
        raw = self.mapping(value, path, ("kind", "dsn", "conn_id", "uri", "mode", "storage_options",
                                         "partition_by", "bookkeeping_schema", "session_replication_role",
                                         "catalog", "namespace", "max_merge_rows"), ("kind",))
        if raw is None:
            return None
        kind = self.choice(raw.get("kind"), _join(path, "kind"), TARGET_KINDS, "postgres") \
            if "kind" in raw else "postgres"
        if kind == "delta":
            return self.delta_target(raw, path)
        if kind == "iceberg":
            return self.iceberg_target(raw, path)
        for key in ("uri", "storage_options", "max_merge_rows"):
            if key in raw:
                self.err(_join(path, key), "only for kind: delta")
        for key in ("mode", "partition_by"):
            if key in raw:
                self.err(_join(path, key), "only for kind: delta or iceberg")
        for key in ("catalog", "namespace"):
            if key in raw:
                self.err(_join(path, key), "only for kind: iceberg")
        dsn, conn_id = self.connection(raw, path)
        schema = self.string(raw.get("bookkeeping_schema"), _join(path, "bookkeeping_schema"),
                             required="bookkeeping_schema" in raw)
        role = self.choice(raw.get("session_replication_role"), _join(path, "session_replication_role"),
                           REPLICATION_ROLES, "origin")
        return TargetSpec(kind=kind, dsn=dsn, conn_id=conn_id, bookkeeping_schema=schema,
                          session_replication_role=role)

    def delta_tables(self, target: TargetSpec, tables: dict[str, TableSpec],
                     selectors: dict[str, TableSpec] | None = None, path: str = "") -> None:
        """What a lake target (Delta, Iceberg) cannot do with the tables' settings, and partitions of tables it does
        not write."""
        selectors = selectors or {}

        def selected(name: str) -> bool:
            return "*" in selectors or f"{name.partition('.')[0]}.*" in selectors

        for name, entry in {**tables, **selectors}.items():
            if entry.conflict == "strict":
                self.err(_join(path, f"tables.{name}.conflict"), f"strict is not supported by a {target.kind} target (no unique keys)")
            if entry.leaves != "own":  # a leaf's TRUNCATE is a delete by its PostgreSQL partition constraint
                self.err(_join(path, f"tables.{name}.leaves"), "route_to_root is only for target kind: postgres so far")
        targets = {t.target_name: t for t in tables.values()}
        for target_name, cols in target.partition_by.items():
            spec = targets.get(target_name)
            if spec is None and selected(target_name):
                continue  # a selected table's target: known at run time
            if spec is None:
                self.err(f"{path or 'target'}.partition_by.{target_name}", "is not the target of any table")
            elif spec.columns is not None and set(cols) - set(spec.columns):
                self.err(f"{path or 'target'}.partition_by.{target_name}", "partition columns must be among the table's columns")

    def delta_target(self, raw: dict[str, Any], path: str) -> TargetSpec:
        if "dsn" in raw:
            self.err(_join(path, "dsn"), "a delta target has a uri, not a dsn")
        if "bookkeeping_schema" in raw:
            self.err(_join(path, "bookkeeping_schema"), "only for kind: postgres (Delta keeps its watermarks in its log)")
        if "session_replication_role" in raw:
            self.err(_join(path, "session_replication_role"), "only for kind: postgres (Delta tables have no triggers)")
        for key in ("catalog", "namespace"):
            if key in raw:
                self.err(_join(path, key), "only for kind: iceberg")
        uri = self.string(raw.get("uri"), _join(path, "uri"), required=True)
        conn_id = self.string(raw.get("conn_id"), _join(path, "conn_id"))
        mode = self.choice(raw.get("mode"), _join(path, "mode"), DELTA_MODES, "mirror")
        options: dict[str, str] = {}
        opts = raw.get("storage_options") or {}
        if not isinstance(opts, dict):
            self.err(_join(path, "storage_options"), f"expected a mapping of option to value, got {_kind(opts)}")
            opts = {}
        for key, val in opts.items():
            kpath = _join(_join(path, "storage_options"), str(key))
            if SECRET_OPTION.search(str(key)):
                self.err(kpath, "credentials come from the environment or conn_id, never from the spec")
            elif (text := self.string(val if not isinstance(val, bool) else str(val).lower(), kpath)) is not None:
                options[str(key)] = text
        partitions = self.partition_by(raw, path)
        max_merge_rows = self.count(raw.get("max_merge_rows"), _join(path, "max_merge_rows"))
        if max_merge_rows is not None and mode != "mirror":
            self.err(_join(path, "max_merge_rows"), "only for mode: mirror (a change feed appends in one commit)")
        return TargetSpec(kind="delta", conn_id=conn_id, uri=uri or "", mode=mode, storage_options=options,
                          partition_by=partitions, max_merge_rows=max_merge_rows)

    def partition_by(self, raw: dict[str, Any], path: str) -> dict[str, tuple[str, ...]]:
        partitions: dict[str, tuple[str, ...]] = {}
        parts = raw.get("partition_by") or {}
        if not isinstance(parts, dict):
            self.err(_join(path, "partition_by"), f"expected a mapping of schema.table to columns, got {_kind(parts)}")
            parts = {}
        for table, cols in parts.items():
            tpath = _join(_join(path, "partition_by"), str(table))
            if not isinstance(table, str) or not _qualified_ok(table):
                self.err(tpath, "must be schema.table (a target table)")
            elif (names := self.columns(cols, tpath)) is not None:
                partitions[table] = names
        return partitions

    def iceberg_target(self, raw: dict[str, Any], path: str) -> TargetSpec:
        for key, why in (("dsn", "an iceberg target has a catalog, not a dsn"),
                         ("uri", "an iceberg target's tables are found through its catalog (catalog.uri, "
                                 "catalog.warehouse)"),
                         ("storage_options", "pass FileIO properties in catalog"),
                         ("bookkeeping_schema", "only for kind: postgres (Iceberg keeps its watermarks in each "
                                                "table's metadata)"),
                         ("session_replication_role", "only for kind: postgres (Iceberg tables have no triggers)"),
                         ("max_merge_rows", "only for kind: delta (an Iceberg batch commits once per table)")):
            if key in raw:
                self.err(_join(path, key), why)
        conn_id = self.string(raw.get("conn_id"), _join(path, "conn_id"))
        mode = self.choice(raw.get("mode"), _join(path, "mode"), ICEBERG_MODES, "mirror")
        namespace = self.string(raw.get("namespace"), _join(path, "namespace"))
        if namespace is not None and any(not part.strip() for part in namespace.split(".")):
            self.err(_join(path, "namespace"), "expected a namespace name, levels separated by dots")
        cpath = _join(path, "catalog")
        catalog: dict[str, str] = {}
        given = raw.get("catalog")
        if given is None:
            self.err(cpath, "required key is missing")
            given = {}
        elif not isinstance(given, dict):
            self.err(cpath, f"expected a mapping of pyiceberg catalog properties, got {_kind(given)}")
            given = {}
        for key, val in given.items():
            kpath = _join(cpath, str(key))
            if SECRET_OPTION.search(str(key)):
                self.err(kpath, "credentials come from the environment or conn_id, never from the spec")
            elif (text := self.string(val if not isinstance(val, bool) else str(val).lower(), kpath)) is not None:
                catalog[str(key)] = text
        if "catalog" in raw and "type" not in given:
            self.err(_join(cpath, "type"), f"required key is missing ({' or '.join(ICEBERG_CATALOGS)})")
        elif "type" in catalog:
            self.choice(catalog["type"], _join(cpath, "type"), ICEBERG_CATALOGS, "sql")
            if catalog["type"] == "sql":
                for key in ("uri", "warehouse"):
                    if key not in given:
                        self.err(_join(cpath, key), "required key is missing (a sql catalog has a uri and a warehouse)")
        return TargetSpec(kind="iceberg", conn_id=conn_id, mode=mode, partition_by=self.partition_by(raw, path),
                          catalog=catalog, namespace=namespace)

    def schemas(self, value: Any, path: str, selectors: dict[str, TableSpec]) -> None:
        """``schemas: [sales]``: every published table of each schema, default settings (a ``sales.*``
        entry under ``tables`` gives them settings instead)."""
        if not isinstance(value, list) or not value:
            self.err(path, f"expected a non-empty list of schema names, got {_kind(value)}")
            return
        for i, schema in enumerate(value):
            if not isinstance(schema, str) or not schema.strip() or "." in schema:
                self.err(f"{path}[{i}]", f"expected a schema name (no dots), got {_kind(schema)}")
            elif f"{schema}.*" in selectors:
                self.err(f"{path}[{i}]", f"schema {schema!r} is selected twice (schemas and tables.{schema}.*)")
            else:
                selectors[f"{schema}.*"] = TableSpec(name=f"{schema}.*")

    def tables(self, value: Any, path: str, selectors: dict[str, TableSpec] | None = None) -> dict[str, TableSpec]:
        if value is None or value == {}:
            self.err(path, "list at least one table as schema.table")
            return {}
        if not isinstance(value, dict):
            self.err(path, f"expected a mapping of schema.table to settings, got {_kind(value)}")
            return {}
        tables: dict[str, TableSpec] = {}
        targets: dict[str, str] = {}
        for name, settings in value.items():
            tpath = _join(path, str(name))
            if isinstance(name, str) and (name == "*" or name.endswith(".*")):
                # "*": every table of the publication; "schema.*": every published table of the schema.
                # Named entries override them (pipeline/source.py resolves them at run time).
                if name != "*" and (not _qualified_ok(name[:-2] + ".x") or "*" in name[:-2]):
                    self.err(tpath, 'a selection is "*" or schema.*')
                    continue
                selector = self.table(name, settings, tpath)
                if selector is not None and selector.target is not None:
                    self.err(_join(tpath, "target"), "a selection keeps each table's own name; name a target "
                                                     "in an entry of its own")
                elif selector is not None and selector.leaves != "own":
                    self.err(_join(tpath, "leaves"), "only for a named partitioned table (its leaves go to its target)")
                elif selector is not None:
                    (selectors if selectors is not None else {})[name] = selector
                continue
            if not isinstance(name, str) or not _qualified_ok(name):
                self.err(tpath, "table names must be schema.table")
                continue
            table = self.table(name, settings, tpath)
            if table is None:
                continue
            if table.target_name in targets:
                self.err(tpath, f"target {table.target_name} is also the target of {targets[table.target_name]}")
            targets[table.target_name] = name
            tables[name] = table
        return tables

    def table(self, name: str, value: Any, path: str) -> TableSpec | None:
        raw = self.mapping(value, path, ("row_filter", "columns", "target", "conflict", "unchanged_toast",
                                         "key_columns", "actions", "schema_changes", "leaves"))
        if raw is None:
            return None
        row_filter = self.string(raw.get("row_filter"), _join(path, "row_filter"), required="row_filter" in raw)
        columns = self.columns(raw.get("columns"), _join(path, "columns")) if "columns" in raw else None
        key_columns = self.columns(raw.get("key_columns"), _join(path, "key_columns")) if "key_columns" in raw else None
        target = self.string(raw.get("target"), _join(path, "target"), required="target" in raw)
        if target is not None and not _qualified_ok(target):
            self.err(_join(path, "target"), "must be schema.table")
            target = None
        if row_filter is not None:
            row_filter = self.row_filter(row_filter, _join(path, "row_filter"), columns)
        if columns is not None and key_columns is not None:
            for col in key_columns:
                if col not in columns:
                    self.err(_join(path, "key_columns"), f"key column {col!r} is not in columns")
        actions = self.actions(raw.get("actions"), _join(path, "actions")) if "actions" in raw else ACTIONS
        return TableSpec(
            name=name, row_filter=row_filter, columns=columns, target=target, key_columns=key_columns,
            actions=actions,
            schema_changes=self.choice(raw.get("schema_changes"), _join(path, "schema_changes"),
                                       SCHEMA_CHANGE_POLICIES, "follow"),
            conflict=self.choice(raw.get("conflict"), _join(path, "conflict"), CONFLICT_POLICIES, "upsert"),
            unchanged_toast=self.choice(raw.get("unchanged_toast"), _join(path, "unchanged_toast"), TOAST_POLICIES,
                                        "fail"),
            leaves=self.choice(raw.get("leaves"), _join(path, "leaves"), LEAF_POLICIES, "own"),
        )

    def columns(self, value: Any, path: str) -> tuple[str, ...] | None:
        if not isinstance(value, list) or not value:
            self.err(path, f"expected a non-empty list of column names, got {_kind(value)}")
            return None
        names: list[str] = []
        for i, col in enumerate(value):
            if not isinstance(col, str) or not col.strip():
                self.err(f"{path}[{i}]", f"expected a column name, got {_kind(col)}")
            elif col in names:
                self.err(f"{path}[{i}]", f"column {col!r} is listed twice")
            else:
                names.append(col)
        return tuple(names)

    def actions(self, value: Any, path: str) -> tuple[str, ...]:
        """Published actions, like ``publish = 'insert, update'``; an empty list publishes nothing."""
        if not isinstance(value, list):
            self.err(path, f"expected a list of {', '.join(ACTIONS)}, got {_kind(value)}")
            return ACTIONS
        chosen: list[str] = []
        for i, action in enumerate(value):
            if action not in ACTIONS:
                self.err(f"{path}[{i}]", f"must be one of {', '.join(ACTIONS)}, got {action!r}")
            elif action in chosen:
                self.err(f"{path}[{i}]", f"action {action!r} is listed twice")
            else:
                chosen.append(action)
        return tuple(a for a in ACTIONS if a in chosen)

    def row_filter(self, expression: str, path: str, columns: tuple[str, ...] | None) -> str | None:
        """The filter as PostgreSQL's parser reads it, deparsed (what the snapshot and the apply evaluate);
        None when publication rules refuse it (reported). With ``columns`` it may use only those: PostgreSQL
        evaluates it on the published tuple."""
        try:
            parsed = parse_row_filter(expression)
        except RowFilterError as exc:
            self.err(path, str(exc))
            return None
        missing = sorted(parsed.columns - set(columns)) if columns is not None else []  # exact, as PostgreSQL's
        if missing and columns is not None:
            self.err(path, f"references column(s) {', '.join(missing)} not in columns{fold_hint(missing, columns)}")
        return parsed.sql

    def truncate(self, value: Any, path: str) -> TruncateSpec:
        raw = self.mapping(value, path, ("cascade",))
        if not raw:
            return TruncateSpec()
        return TruncateSpec(cascade=self.choice(raw.get("cascade"), _join(path, "cascade"), TRUNCATE_CASCADE,
                                                "follow_source"))

    def snapshot(self, value: Any, path: str) -> SnapshotSpec:
        raw = self.mapping(value, path, ("initial", "parallelism", "chunk_size"))
        if not raw:
            return SnapshotSpec()
        default = SnapshotSpec()
        parallelism = self.count(raw.get("parallelism"), _join(path, "parallelism"))
        if parallelism is not None and parallelism > 64:
            self.err(_join(path, "parallelism"), f"at most 64 reader processes, got {parallelism}")
        chunk = self.size(raw.get("chunk_size"), _join(path, "chunk_size"))
        if chunk is not None and chunk < (1 << 20):
            self.err(_join(path, "chunk_size"), "must be at least 1MB of table heap")
        return SnapshotSpec(initial=self.boolean(raw.get("initial"), _join(path, "initial"), False),
                            parallelism=parallelism or default.parallelism, chunk_size=chunk or default.chunk_size)

    def spark(self, value: Any, path: str) -> SparkSpec:
        raw = self.mapping(value, path, ("conn_id", "master", "conf", "remote", "connect_conn_id", "apply_in_worker"))
        if not raw:
            return SparkSpec()
        conf = raw.get("conf") or {}
        if not isinstance(conf, dict):
            self.err(_join(path, "conf"), f"expected a mapping of Spark settings, got {_kind(conf)}")
            conf = {}
        for key in sorted(k for k in map(str, conf) if k in _WHERE_SETTINGS):
            # Set after the master, they would give the run another session than the one it decides on (whether
            # this process reads staged files itself): where Spark runs has its own keys.
            self.err(_join(_join(path, "conf"), key), f"where Spark runs is not a conf setting: give it as "
                     f"{_join(path, _WHERE_SETTINGS[key])}: instead")
        for key in sorted(str(k) for k, v in conf.items() if _conf_value(v) != SESSION_CONF.get(str(k), _conf_value(v))):
            # the apply's exactness rests on them (UTC, names resolved as PostgreSQL's, no substitution in SQL text)
            self.err(_join(_join(path, "conf"), key), f"the apply sets it to {SESSION_CONF[key]}: leave it out")
        return SparkSpec(
            conn_id=self.string(raw.get("conn_id"), _join(path, "conn_id")),
            master=self.string(raw.get("master"), _join(path, "master")),
            conf={str(k): str(v) for k, v in conf.items()},
            remote=self.remote(raw, path),
            connect_conn_id=self.string(raw.get("connect_conn_id"), _join(path, "connect_conn_id")),
            apply_in_worker=self.boolean(raw.get("apply_in_worker"), _join(path, "apply_in_worker"), True),
        )

    def remote(self, raw: dict[str, Any], path: str) -> str | None:
        """``spark.remote``: a Spark Connect URL (``sc://host:port``), not together with ``master``."""
        remote = self.string(raw.get("remote"), _join(path, "remote"))
        if remote is None:
            return None
        if not remote.startswith(SPARK_CONNECT_SCHEME):
            self.err(_join(path, "remote"), f"expected a Spark Connect URL {SPARK_CONNECT_SCHEME}host:port")
        if raw.get("master") is not None:
            self.err(_join(path, "remote"), "give either master (a session in the process) or remote (Spark Connect)")
        return remote


def check_row_filters(spec: PipelineSpec, spark: Any) -> None:
    """Parse every row filter (already checked by PostgreSQL's parser at spec load) with Spark's parser,
    as the apply will: the constructs Spark evaluates exactly like PostgreSQL (``apply/filters.py``).

    Raises SpecError naming the table.
    """
    from airflow_provider_pglogical.apply.filters import referenced_columns

    errors = []
    for target, view in spec.target_views().items():  # each target's own filters (``targets:`` has several)
        where = f"targets.{target}.tables" if spec.targets else "tables"
        for name, table in {**view.selectors, **view.tables}.items():
            if table.row_filter is None:
                continue
            try:
                referenced_columns(spark, table.row_filter)
            except RowFilterError as exc:
                errors.append(f"{where}.{name}.row_filter: {exc}")
    if errors:
        raise SpecError(f"{spec.origin}: " + "; ".join(errors))


def _qualified_ok(name: str) -> bool:
    schema, dot, table = name.partition(".")
    return bool(dot and schema.strip() and table.strip() and "." not in table)


_WHERE_SETTINGS = {"spark.master": "master", "spark.remote": "remote"}  # conf keys → their own spec keys


def _conf_value(value: Any) -> str:
    """A spec's Spark setting as Spark reads it: YAML's ``true`` is ``"true"``, and Spark's booleans ignore case."""
    return str(value).lower() if isinstance(value, bool) or str(value).lower() in ("true", "false") else str(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
            dict: "a mapping"}.get(type(value), type(value).__name__)
