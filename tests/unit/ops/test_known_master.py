"""The in-worker apply reads staging on an object store itself only when the Spark connection's master is local:
the master as Airflow's SparkSubmitHook builds it from the connection, never a host name that starts with "local"."""

from __future__ import annotations

import json

import pytest


def _operator() -> object:
    from airflow_provider_pglogical.operators.apply import PgLogicalApplyOperator

    return PgLogicalApplyOperator(task_id="apply", slot="s", staging_uri="s3://bucket/staging", target_conn_id="dw")


@pytest.mark.parametrize(("connection", "expected"), [
    ({"conn_type": "spark", "host": "local[2]"}, "local[2]"),
    ({"conn_type": "spark", "host": "yarn"}, "yarn"),
    # the hook submits to spark://localhost:7077: a standalone master, not this process's Spark
    ({"conn_type": "spark", "host": "localhost", "port": 7077}, None),
    ({"conn_type": "spark", "host": "local", "port": 7077}, None),
    ({"conn_type": "spark", "host": "spark://localhost", "port": 7077}, None),
    ({"conn_type": "k8s", "host": "local[2]"}, None),  # the hook builds k8s://local[2]
])
def test_the_known_master_is_the_connection_s_when_the_hook_would_submit_to_it_as_given(monkeypatch, connection,
                                                                                       expected):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))
    assert _operator()._known_master() == expected  # type: ignore[attr-defined]


def test_a_connection_uri_with_host_localhost_and_a_port_is_not_local(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", "spark://localhost:7077")
    assert _operator()._known_master() is None  # type: ignore[attr-defined]


def test_a_missing_connection_is_no_known_master(monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    assert _operator()._known_master() is None  # type: ignore[attr-defined]
