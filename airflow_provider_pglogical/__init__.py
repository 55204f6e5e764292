"""Apache Airflow provider for batch PostgreSQL logical decoding with pgoutput."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def get_provider_info() -> dict[str, Any]:
    """Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""
    return {
        "package-name": "airflow-provider-pglogical",
        "name": "PostgreSQL logical decoding (pgoutput)",
        "description": "Drain pgoutput replication slots into LSN-keyed Parquet and apply it with Spark.",
        "versions": [__version__],
        "hooks": [
            {"integration-name": "PostgreSQL logical decoding",
             "python-modules": ["airflow_provider_pglogical.hooks.pglogical"]},
        ],
        "operators": [
            {"integration-name": "PostgreSQL logical decoding",
             "python-modules": ["airflow_provider_pglogical.operators.decode",
                                "airflow_provider_pglogical.operators.apply",
                                "airflow_provider_pglogical.pipeline.operators"]},
        ],
        "sensors": [
            {"integration-name": "PostgreSQL logical decoding",
             "python-modules": ["airflow_provider_pglogical.sensors.slot_lag"]},
        ],
        "triggers": [
            {"integration-name": "PostgreSQL logical decoding",
             "python-modules": ["airflow_provider_pglogical.triggers.slot_lag"]},
        ],
        "asset-uris": [
            {"schemes": ["pglogical"],
             "handler": "airflow_provider_pglogical.assets.pglogical.sanitize_uri",
             "factory": "airflow_provider_pglogical.assets.pglogical.create_asset",
             "to_openlineage_converter": "airflow_provider_pglogical.assets.pglogical.convert_asset_to_openlineage"},
        ],
        "connection-types": [],
    }
