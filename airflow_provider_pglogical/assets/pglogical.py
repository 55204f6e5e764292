"""The ``pglogical://`` Asset URI scheme: staged change logs and applied target tables of a slot.

Two shapes, told apart by their path (registered in ``get_provider_info()["asset-uris"]``):

* ``pglogical://<slot>/<schema>.<table>`` — the staged changes of one *source* table
  (the decode task's outlets);
* ``pglogical://<slot>/target/<schema>.<table>`` — one *target* table the apply task writes
  (the apply task's outlets: schedule downstream DAGs on these);
* ``pglogical://<slot>/target/<location>/<schema>.<table>`` — the same for one target of a spec with several
  (``targets:``), whose tables may share a name: ``location`` is where that target writes (``SpecTarget.location``:
  its database, Delta table root or Iceberg catalog and namespace), quoted into one segment.

Schema and table are URL-quoted with '.' escaped too (``staging.layout.quote_name``), so the one
literal '.' separates them and every name maps to exactly one URI.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from urllib.parse import SplitResult, unquote, urlsplit

from airflow.sdk import Asset

from airflow_provider_pglogical.staging.layout import quote_name

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset as OpenLineageDataset

SCHEME = "pglogical"
TARGET_SEGMENT = "target"
# PostgreSQL's rule for replication slot names (ReplicationSlotValidateName, slot.c).
_SLOT = re.compile(r"[a-z0-9_]{1,63}")

AssetKind = Literal["staged", "target"]


class AssetRef(NamedTuple):
    """What a ``pglogical://`` URI names (``location``: the target's place, for one target of several)."""

    slot: str
    kind: AssetKind
    schema: str
    table: str
    location: str | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.schema}.{self.table}"


def asset_uri(slot: str, qualified_name: str, kind: AssetKind = "staged", location: str | None = None) -> str:
    """The canonical URI of a slot's staged (``kind='staged'``) or applied (``'target'``) table; ``location``: where
    the target writes, for one target of several (target tables only)."""
    schema, dot, table = qualified_name.partition(".")
    if not dot or not schema or not table:
        raise ValueError(f"expected schema.table, got {qualified_name!r}")
    if not _SLOT.fullmatch(slot):
        raise ValueError(f"invalid replication slot name {slot!r} in a {SCHEME}:// asset")
    if location is not None and (kind != "target" or not location):
        raise ValueError(f"only a target table's {SCHEME}:// asset has a location, and it is not empty")
    prefix = f"/{TARGET_SEGMENT}" if kind == "target" else ""
    if location is not None:
        prefix += f"/{quote_name(location)}"
    return f"{SCHEME}://{slot}{prefix}/{quote_name(schema)}.{quote_name(table)}"


def _parse(uri: SplitResult) -> AssetRef:
    if uri.scheme.lower() != SCHEME:
        raise ValueError(f"not a {SCHEME}:// URI: scheme {uri.scheme!r}")
    if uri.username or uri.password or uri.port is not None or ":" in uri.netloc:
        raise ValueError(f"{SCHEME}:// URIs name a replication slot as host, with no user, password or port")
    slot = uri.netloc.lower()  # URI hosts are case-insensitive; slot names are lower case
    if not _SLOT.fullmatch(slot):
        raise ValueError(f"{SCHEME}:// URI must name a replication slot (a-z, 0-9, _; at most 63) as host, "
                         f"got {uri.netloc!r}")
    if uri.query:
        raise ValueError(f"{SCHEME}:// URIs take no query string")
    segments = uri.path.split("/")[1:] if uri.path.startswith("/") else []
    location: str | None = None
    if len(segments) in (2, 3) and segments[0] == TARGET_SEGMENT:
        kind: AssetKind = "target"
        segment = segments[-1]
        if len(segments) == 3:
            location = unquote(segments[1])
            if not location:
                raise ValueError(f"{SCHEME}:// URI has an empty target location: {uri.path!r}")
    elif len(segments) == 1:
        kind, segment = "staged", segments[0]
    else:
        raise ValueError(f"{SCHEME}:// URI path must be /<schema>.<table>, /{TARGET_SEGMENT}/<schema>.<table> or "
                         f"/{TARGET_SEGMENT}/<location>/<schema>.<table>, got {uri.path!r}")
    schema, dot, table = segment.partition(".")
    if not dot or "." in table:
        raise ValueError(f"{SCHEME}:// URI must name one <schema>.<table>, with dots inside names written as %2E; "
                         f"got {segment!r}")
    schema, table = unquote(schema), unquote(table)
    if not schema or not table:
        raise ValueError(f"{SCHEME}:// URI has an empty schema or table name: {segment!r}")
    return AssetRef(slot, kind, schema, table, location)


def parse_asset_uri(uri: str) -> AssetRef:
    """Slot, kind, schema and table of a ``pglogical://`` URI (ValueError when it is not one)."""
    return _parse(urlsplit(uri))


def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's URI handler for the scheme: validate, then normalise to the canonical form.

    Canonical: lower-case slot, names quoted exactly as :func:`asset_uri` quotes them (so
    ``%2e``/``%2E`` and needlessly quoted letters compare equal), no fragment.
    """
    ref = _parse(uri)
    return urlsplit(asset_uri(ref.slot, ref.qualified_name, ref.kind, ref.location))


def create_asset(*, slot: str, table: str, kind: AssetKind = "staged", location: str | None = None,
                 extra: dict[str, Any] | None = None) -> Asset:
    """Asset factory registered for the scheme (``table`` is ``schema.table``)."""
    uri = asset_uri(slot, table, kind, location)
    return Asset(uri=uri, name=uri, extra=extra or {})


def staged_table_asset(slot: str, qualified_name: str) -> Asset:
    """The Asset of one source table's staged changes: ``pglogical://<slot>/<schema>.<table>``."""
    return create_asset(slot=slot, table=qualified_name)


def target_table_asset(slot: str, qualified_name: str, location: str | None = None) -> Asset:
    """The Asset of one target table the slot's apply writes: ``pglogical://<slot>/target/<schema>.<table>``, or
    with ``location`` (one target of several) ``pglogical://<slot>/target/<location>/<schema>.<table>``."""
    return create_asset(slot=slot, table=qualified_name, kind="target", location=location)


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> OpenLineageDataset:
    """OpenLineage dataset of a ``pglogical://`` Asset: namespace ``pglogical://<slot>``, name the table
    (``target/`` in front for target tables, and the quoted location of one target of several, so no two share a
    name)."""
    from airflow.providers.common.compat.openlineage.facet import Dataset as OpenLineageDataset

    ref = parse_asset_uri(asset.uri)
    prefix = f"{TARGET_SEGMENT}/" if ref.kind == "target" else ""
    if ref.location is not None:
        prefix += f"{quote_name(ref.location)}/"
    return OpenLineageDataset(namespace=f"{SCHEME}://{ref.slot}", name=prefix + ref.qualified_name)
