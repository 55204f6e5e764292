"""Pipeline spec: load a YAML/JSON file describing source, staging, target and tables, and validate it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from airflow_provider_pglogical.exceptions import SpecError

# `${NAME}` or `${NAME:-default}` inside any string value: DSNs and staging paths usually differ
# between laptop, CI and production while the rest of a spec does not.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# PostgreSQL's rule for replication slot names (slot.c, ReplicationSlotValidateName).
SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")
SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?i?b?)?\s*", re.IGNORECASE)
SIZE_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}
NAMEDATALEN = 63

TARGET_KINDS = ("postgres",)
# Kept equal to airflow_provider_pglogical.apply.config's choices (a unit test checks it); not
# imported so loading a spec in a DAG file stays cheap.
TRUNCATE_CASCADE = ("follow_source", "never")
CONFLICT_POLICIES = ("upsert", "strict")
TOAST_POLICIES = ("fail", "reject_and_continue")
ACTIONS = ("insert", "update", "delete", "truncate")
SCHEMA_CHANGE_POLICIES = ("follow", "fail")


@dataclass(frozen=True)
class SourceSpec:
    """The PostgreSQL server whose slot is drained."""

    publication: str
    slot: str
    dsn: str | None = None
    conn_id: str | None = None
    create: bool = False
    max_batch_bytes: int | None = None
    max_changes: int | None = None
    max_lag_bytes: int | None = None
    min_safe_wal_bytes: int | None = None


@dataclass(frozen=True)
class StagingSpec:
    uri: str


@dataclass(frozen=True)
class TargetSpec:
    kind: str
    dsn: str | None = None
    conn_id: str | None = None


@dataclass(frozen=True)
class TableSpec:
    """One published source table and how it lands in the target."""

    name: str  # schema.table on the source
    row_filter: str | None = None
    columns: tuple[str, ...] | None = None  # None: every column
    target: str | None = None  # None: same name as the source
    conflict: str = "upsert"
    unchanged_toast: str = "fail"
    key_columns: tuple[str, ...] | None = None
    actions: tuple[str, ...] = ACTIONS  # published actions (publish = '...'), judged on the original operation
    schema_changes: str = "follow"  # follow source ADD/DROP COLUMN and lossless widening, or fail

    @property
    def target_name(self) -> str:
        return self.target or self.name


@dataclass(frozen=True)
class TruncateSpec:
    cascade: str = "follow_source"


@dataclass(frozen=True)
class SparkSpec:
    conn_id: str = "spark_default"
    master: str | None = None  # CLI default when --master is not given
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineSpec:
    """A validated pipeline spec; build it with :func:`load_spec` or :func:`parse_spec`."""

    source: SourceSpec
    staging: StagingSpec
    target: TargetSpec
    tables: dict[str, TableSpec]
    truncate: TruncateSpec = field(default_factory=TruncateSpec)
    spark: SparkSpec = field(default_factory=SparkSpec)
    origin: str = "<spec>"


def load_spec(path: str | os.PathLike, env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Read and validate a spec file (YAML, or JSON which YAML also reads)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec ({exc.strerror or exc})") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecError(f"{path}: not valid YAML/JSON{where}") from exc
    return parse_spec(raw, origin=str(path), env=env)


def parse_spec(raw: Any, *, origin: str = "<spec>", env: Mapping[str, str] | None = None) -> PipelineSpec:
    """Validate a decoded spec document; every problem found is reported in one SpecError."""
    from airflow_provider_pglogical.pipeline.validation import SpecValidator

    v = SpecValidator(os.environ if env is None else env)
    spec = v.pipeline(raw, origin)
    if v.errors:
        # All problems at once: fixing a spec one error per run is tedious.
        raise SpecError(f"{origin}: " + "; ".join(v.errors))
    assert spec is not None
    return spec


def parse_size(value: Any) -> int:
    """Bytes from an int or a string such as ``512MB`` / ``1 GiB`` (binary units)."""
    if isinstance(value, bool):
        raise ValueError("expected a byte size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if isinstance(value, str):
        m = SIZE.fullmatch(value)
        if m:
            unit = (m.group(2) or "").lower().replace("i", "")
            if unit in ("k", "m", "g", "t"):
                unit += "b"
            if unit in SIZE_UNITS:
                return int(m.group(1)) * SIZE_UNITS[unit]
    raise ValueError("expected a byte size such as 1048576 or '512MB'")


def split_qualified(name: str) -> tuple[str, str]:
    """``schema.table`` → (schema, table); names are unquoted and may not contain dots."""
    schema, _, table = name.partition(".")
    return schema, table
