"""OpenLineage facets of a decode or apply run (imports OpenLineage only when its provider asks)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_provider_pglogical.lineage.datasets import DatasetName

if TYPE_CHECKING:
    from openlineage.client.generated.base import OutputDatasetFacet


def operator_lineage(inputs: Iterable[DatasetName], outputs: Mapping[DatasetName, int | None]) -> Any:
    """An ``OperatorLineage`` with ``inputs`` and ``outputs``, each output with its row count
    (``outputStatistics``) when known. Returns None without the OpenLineage provider."""
    try:
        from airflow.providers.common.compat.openlineage.facet import (
            Dataset,
            OutputDataset,
            OutputStatisticsOutputDatasetFacet,
        )
        from airflow.providers.openlineage.extractors import OperatorLineage
    except ImportError:
        return None

    def output(d: DatasetName, rows: int | None) -> Any:
        facets: dict[str, OutputDatasetFacet] = (
            {} if rows is None else {"outputStatistics": OutputStatisticsOutputDatasetFacet(rowCount=rows)})
        return OutputDataset(namespace=d.namespace, name=d.name, outputFacets=facets)

    unique_inputs = list(dict.fromkeys(inputs))
    return OperatorLineage(inputs=[Dataset(namespace=d.namespace, name=d.name) for d in unique_inputs],
                           outputs=[output(d, rows) for d, rows in outputs.items()])
