"""Composite (record) values: dict in Python, struct in Arrow; binary form carries field type OIDs."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from airflow_provider_pglogical.decoding.values.codec import Codec, Notes, Reader
from airflow_provider_pglogical.exceptions import DecodeError


def split_fields(text: str, closers: str, name: str) -> tuple[list[str | None], int]:
    """Fields of record_out / range_out syntax starting after the opening bracket.

    A field is bare or double-quoted; inside quotes '""' is a quote and '\\x' is x. An empty bare
    field is NULL (record) or an unbounded side (range). Returns the fields and the index of the
    closing character.
    """
    fields: list[str | None] = []
    pos, n = 1, len(text)
    while True:
        out: list[str] = []
        quoted = seen_quote = False
        while pos < n and (quoted or text[pos] not in "," + closers):
            ch = text[pos]
            if ch == "\\":
                pos += 1
                if pos >= n:
                    raise DecodeError(f"invalid {name} text value")
                out.append(text[pos])
            elif ch == '"':
                if quoted and pos + 1 < n and text[pos + 1] == '"':
                    out.append('"')
                    pos += 1
                else:
                    quoted, seen_quote = not quoted, True
            else:
                out.append(ch)
            pos += 1
        if pos >= n:
            raise DecodeError(f"invalid {name} text value")
        # an empty field is NULL only when nothing, not even "", was there
        fields.append(None if not out and not seen_quote else "".join(out))
        if text[pos] == ",":
            pos += 1
            continue
        return fields, pos


class CompositeCodec(Codec):
    """Fields decode by the catalog's field types; a dropped column is never sent (record_send)."""

    def __init__(self, name: str, fields: list[tuple[str, Codec]]) -> None:
        self.name = name
        self.fields = fields
        self.arrow_type = pa.struct([(f, c.arrow_type) for f, c in fields])

    def _binary_fields(self, raw: bytes) -> list[bytes | None]:
        r = Reader(raw, "record")
        ncols = r.int32()
        if ncols != len(self.fields):
            raise DecodeError("record field count does not match the type")
        out = []
        for _ in range(ncols):
            r.uint32()  # field type OID; the catalog's field type decides the codec
            out.append(r.counted())
        r.finish()
        return out

    def _text_fields(self, text: str) -> list[str | None]:
        if not text.startswith("("):
            raise DecodeError("invalid record text value")
        fields, end = split_fields(text, ")", "record")
        if end != len(text) - 1 or len(fields) != len(self.fields):
            raise DecodeError("record field count does not match the type")
        return fields

    def from_binary(self, raw: bytes) -> dict[str, Any]:
        vals = self._binary_fields(raw)
        return {f: None if v is None else c.python("b", v) for (f, c), v in zip(self.fields, vals, strict=True)}

    def from_text(self, text: str) -> dict[str, Any]:
        vals = self._text_fields(text)
        return {f: None if v is None else c.from_text(v) for (f, c), v in zip(self.fields, vals, strict=True)}

    def arrow_from_binary(self, raw: bytes, notes: Notes, path: str) -> dict[str, Any]:
        vals = self._binary_fields(raw)
        return {f: None if v is None else c.arrow("b", v, notes, f"{path}.{f}")
                for (f, c), v in zip(self.fields, vals, strict=True)}

    def arrow_from_text(self, text: str, notes: Notes, path: str) -> dict[str, Any]:
        vals = self._text_fields(text)
        return {f: None if v is None else c.arrow_from_text(v, notes, f"{path}.{f}")
                for (f, c), v in zip(self.fields, vals, strict=True)}
