"""Byte sizes as users write them in specs and operator arguments (``512MB``, ``1 GiB``). Pure."""

from __future__ import annotations

import re
from typing import Any

SIZE = re.compile(r"\s*(\d+)\s*([kmgt]?i?b?)?\s*", re.IGNORECASE)
SIZE_UNITS = {"": 1, "b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3, "tb": 1024**4}


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
