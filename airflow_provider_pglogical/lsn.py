"""LSNs: PostgreSQL's ``X/X`` text, integers, and the fixed-width hex of staged batch names. Pure, no imports."""

from __future__ import annotations

import re

LSN_TEXT = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")


def format_lsn(lsn: int | None) -> str:
    """PostgreSQL's ``X/X`` text form of an LSN (``?`` for an unknown one)."""
    if lsn is None:
        return "?"
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    """``X/X`` text → integer LSN; ValueError for anything else."""
    m = LSN_TEXT.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"not an LSN: {text!r} (expected X/X in hex)")
    return (int(m.group(1), 16) << 32) | int(m.group(2), 16)


def lsn_text(lsn: int | str | None) -> str | None:
    """An LSN as PostgreSQL's ``X/X`` text for a ``::pg_lsn`` parameter (accepts ints and text)."""
    if lsn is None or isinstance(lsn, str):
        return lsn
    return format_lsn(lsn)


def lsn_hex(lsn: int) -> str:
    """16 upper-case hex digits: lexical order of names is LSN order (staged batch directories)."""
    return f"{lsn:016X}"
