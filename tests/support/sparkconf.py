"""Session settings for a test or module, put back as found after it: the suite's Spark session is shared by every
later module on the worker, so a setting one module needs must not become another module's setting."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any


@contextmanager
def session_conf(spark: Any, conf: Mapping[str, str]) -> Iterator[Any]:
    """``conf`` set on ``spark`` inside; after it, each key back to its previous value, or unset if it had none."""
    previous = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield spark
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
