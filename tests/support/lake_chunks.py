"""How many chunks the lake mirrors' streamed commits took, wherever the chunks came from: Spark's key-hash buckets
(``lake/stream.bucket_frames``) or the spill files of net rows read in this process (``lake/parts.py``)."""

from __future__ import annotations

from collections.abc import Generator, Sequence

import pyarrow as pa
import pytest

from airflow_provider_pglogical.apply.targets.lake import parts as lake_parts
from airflow_provider_pglogical.apply.targets.lake import stream


def streamed_chunks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """A list that gains ``("spark", buckets)`` or ``("spill files", chunks)`` for each table-batch streamed."""
    counts: list[tuple[str, int]] = []
    frames, pieces = stream.bucket_frames, lake_parts.SpilledNet.pieces

    def bucketed(net: object, key: Sequence[str], count: int) -> object:
        counts.append(("spark", count))
        return frames(net, key, count)  # type: ignore[arg-type]

    def counted(self: lake_parts.SpilledNet, chunk_rows: int) -> Generator[pa.Table, None, None]:
        made = 0
        for chunk in pieces(self, chunk_rows):
            made += 1
            yield chunk
        counts.append(("spill files", made))

    monkeypatch.setattr(stream, "bucket_frames", bucketed)
    monkeypatch.setattr(lake_parts.SpilledNet, "pieces", counted)
    return counts
