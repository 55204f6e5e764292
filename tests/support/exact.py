"""Values compared exactly: floats bit for bit, as PostgreSQL and the lakes store them."""

from __future__ import annotations

import math


def exact(value: object) -> object:
    """A float compared bit for bit (-0.0 is not 0.0, NaN equals NaN); everything else as it is."""
    if isinstance(value, float):
        return ("nan",) if math.isnan(value) else (value, math.copysign(1.0, value))
    return value
