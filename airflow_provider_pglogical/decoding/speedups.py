"""Which implementation of the drain's hot paths is in use: the compiled ``_speedups`` or pure Python.

``_speedups`` (``_speedups.c``) is built by ``pip install`` when a C compiler is there
(``setup.py``: ``optional=True``, so an install without one still succeeds). Its splitter of the
binary COPY stream of slot rows must give exactly what ``split_copy_py`` (the reference) gives;
a hypothesis property checks that. ``PGLOGICAL_PURE_PYTHON=1`` disables the compiled module
(to compare, or to rule it out).
"""

from __future__ import annotations

import os
import struct
from types import ModuleType

from airflow_provider_pglogical.exceptions import DecodeError

PURE_PYTHON_ENV = "PGLOGICAL_PURE_PYTHON"


def _load() -> ModuleType | None:
    if os.environ.get(PURE_PYTHON_ENV, "").strip() not in ("", "0"):
        return None
    try:
        from airflow_provider_pglogical.decoding import _speedups  # type: ignore[attr-defined]
    except ImportError:
        return None
    from airflow_provider_pglogical.decoding.model import RowChange
    from airflow_provider_pglogical.decoding.wiretuple import WireTuple

    module: ModuleType = _speedups
    # The C paths build RowChange/WireTuple objects themselves, through their slots.
    module.init_types(WireTuple, RowChange, "I", "U", "D")
    return module


compiled: ModuleType | None = _load()


def implementation() -> str:
    """``"compiled"`` when the C helpers are in use, else ``"python"``."""
    return "compiled" if compiled is not None else "python"


SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_ROW = struct.Struct("!hiqiqi")  # field count, (len, lsn), (len, xid), len of data
SlotRow = tuple[int, int, bytes]


def split_copy_py(data: bytes, header: bool) -> tuple[list[SlotRow], int, bool]:
    """Split a binary COPY stream of ``(bigint lsn, bigint xid, bytea data)`` rows (the reference).

    Returns the rows, the offset after the last whole row (or after the trailer), and whether the
    trailer was reached. ``header``: ``data`` starts with the stream's header. Anything else than
    three non-null fields of those types, or a row cut short, is a ``ValueError``.
    """
    pos, end = 0, len(data)
    if header:
        if end < 19 or data[:11] != SIGNATURE:
            raise ValueError("binary COPY stream without its signature")
        ext = int.from_bytes(data[15:19], "big")
        if ext > end - 19:
            raise ValueError("truncated binary COPY header")
        pos = 19 + ext
    rows: list[SlotRow] = []
    unpack = _ROW.unpack_from
    while pos < end:
        if end - pos < 2:
            raise ValueError(f"binary COPY row truncated at offset {pos}")
        nfields = int.from_bytes(data[pos:pos + 2], "big", signed=True)
        if nfields == -1:
            return rows, pos + 2, True
        if nfields != 3:
            raise ValueError(f"binary COPY row with {nfields} fields, expected 3")
        if end - pos < 30:
            raise ValueError(f"binary COPY row truncated at offset {pos}")
        _, lsn_len, lsn, xid_len, xid, n = unpack(data, pos)
        if lsn_len != 8 or xid_len != 8:
            raise ValueError("binary COPY row whose lsn or xid is not a non-null bigint")
        if n < 0:
            raise ValueError("binary COPY row with a null data field")
        if n > end - pos - 30:
            raise ValueError(f"binary COPY row truncated at offset {pos}")
        rows.append((lsn, xid, data[pos + 30:pos + 30 + n]))
        pos += 30 + n
    return rows, pos, False


def split_copy(data: bytes, header: bool) -> tuple[list[SlotRow], int, bool]:
    """``split_copy_py``, compiled when available."""
    if compiled is not None:
        rows, pos, trailer = compiled.split_copy(data, header)
        return rows, pos, trailer
    return split_copy_py(data, header)


__all__ = ["PURE_PYTHON_ENV", "DecodeError", "compiled", "implementation", "split_copy", "split_copy_py"]
