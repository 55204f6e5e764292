"""The docker/ stack: compose structure checked with PyYAML, and `docker compose config` when a compose binary works."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from airflow_provider_pglogical.pipeline.spec import load_spec

DOCKER = Path(__file__).resolve().parents[2] / "docker"
AIRFLOW_SERVICES = ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DOCKER / "docker-compose.yml").read_text())


def test_the_stack_has_postgres_spark_and_the_airflow_3_services(compose):
    assert set(compose["services"]) >= {"postgres", "spark-master", "spark-worker", "airflow-init", *AIRFLOW_SERVICES}


def test_postgres_runs_with_logical_wal_level_and_a_slot_wal_cap(compose):
    command = " ".join(compose["services"]["postgres"]["command"])
    assert "wal_level=logical" in command and "max_slot_wal_keep_size=" in command
    assert compose["services"]["postgres"]["healthcheck"]["test"][1] == "pg_isready"


def test_every_airflow_service_runs_the_provider_image_with_the_dags_and_staging_mounted(compose):
    for name in ("airflow-init", *AIRFLOW_SERVICES):
        service = compose["services"][name]
        assert service["build"]["dockerfile"] == "docker/Dockerfile", name
        assert "../dags:/opt/airflow/dags:ro" in service["volumes"], name
        assert "staging:/var/lib/pglogical/staging" in service["volumes"], name
        assert service["environment"]["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name
        assert service["environment"]["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://airflow-apiserver")


def test_the_example_specs_connections_are_defined_for_airflow(compose):
    env = compose["services"]["airflow-scheduler"]["environment"]
    spec = load_spec(DOCKER.parent / "dags" / "specs" / "example_pipeline.yaml", env=env)
    for conn_id in (spec.source.conn_id, spec.target.conn_id):
        assert f"AIRFLOW_CONN_{conn_id.upper()}" in env
    assert spec.staging.uri == "/var/lib/pglogical/staging"
    spark = json.loads(env[f"AIRFLOW_CONN_{spec.spark.submit_conn_id.upper()}"])
    assert spark["host"] == "spark://spark-master" and spark["port"] == 7077


def test_spark_executors_see_the_same_staging_volume_as_airflow(compose):
    assert "staging:/var/lib/pglogical/staging" in compose["services"]["spark-worker"]["volumes"]
    assert set(compose["volumes"]) >= {"pgdata", "staging"}


def test_the_init_sql_creates_the_source_target_and_metadata_databases():
    sql = (DOCKER / "initdb" / "01-databases.sql").read_text()
    for db in ("app", "dw", "airflow"):
        assert f"CREATE DATABASE {db};" in sql


def test_the_image_installs_the_repo_with_the_lock_on_the_airflow_3_3_2_base():
    dockerfile = (DOCKER / "Dockerfile").read_text()
    assert dockerfile.splitlines()[[i for i, line in enumerate(dockerfile.splitlines())
                                    if line.startswith("FROM")][0]] == "FROM apache/airflow:3.3.2-python3.11"
    assert "-c /opt/pglogical/constraints.txt /opt/pglogical" in dockerfile


def test_docker_compose_config_accepts_the_file():
    docker = shutil.which("docker")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True) if docker else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no working `docker compose` on this machine (the docker client has no compose plugin)")
    result = subprocess.run([docker, "compose", "-f", str(DOCKER / "docker-compose.yml"), "config", "--quiet"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
