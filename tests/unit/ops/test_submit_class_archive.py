"""The DAG's spark-submit on a local master maps Spark's classes from the machine's class archive
(apply/jvm_archive.py): its options go after the spec's own driver options; a cluster's driver never gets them.
The session settings the apply's exactness rests on (``SESSION_CONF``) override the task's own."""

from __future__ import annotations

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from airflow_provider_pglogical.apply import jvm_archive
from airflow_provider_pglogical.apply.sparkenv import SESSION_CONF
from airflow_provider_pglogical.operators.apply import prepare_submit

OWN = {"spark.driver.extraJavaOptions": "-Dmine=1"}


@pytest.fixture
def archive(tmp_path, monkeypatch):
    """A class archive in place (its bytes do not matter here: the JVM checks them, not the operator)."""
    monkeypatch.setenv(jvm_archive.DIR_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    path = jvm_archive.archive_path()
    assert path is not None, "no pyspark jars or no java on this machine"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    return path


def submitted_conf(tmp_path, master: str, env_vars: dict[str, str] | None = None) -> dict[str, str]:
    op = SparkSubmitOperator(task_id="apply", application="app.py", conf=dict(OWN), env_vars=env_vars)
    prepare_submit(op, master, str(tmp_path), None, str(tmp_path / "staging"), None)
    return dict(op.conf or {})


def test_a_local_spark_submit_gets_the_archive_after_the_specs_own_driver_options(archive, tmp_path):
    options = submitted_conf(tmp_path, "local[*]")["spark.driver.extraJavaOptions"]
    assert options == f"-Dmine=1 {jvm_archive.archive_options(archive)}"


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "yarn"])
def test_a_cluster_spark_submit_never_gets_the_archive(archive, tmp_path, master):
    assert submitted_conf(tmp_path, master)["spark.driver.extraJavaOptions"] == "-Dmine=1"


def test_the_tasks_own_class_sharing_choice_or_the_switch_leave_the_options_alone(archive, tmp_path, monkeypatch):
    assert submitted_conf(tmp_path, "local[2]", {"SPARK_SUBMIT_OPTS": "-Xshare:off"})[
        "spark.driver.extraJavaOptions"] == "-Dmine=1"
    monkeypatch.setenv(jvm_archive.SWITCH, "off")
    assert submitted_conf(tmp_path, "local[2]")["spark.driver.extraJavaOptions"] == "-Dmine=1"


def test_the_session_settings_the_apply_relies_on_override_the_tasks_own(tmp_path):
    op = SparkSubmitOperator(task_id="apply", application="app.py",
                             conf={"spark.sql.caseSensitive": "false", "spark.sql.ansi.enabled": "true"})
    prepare_submit(op, "yarn", str(tmp_path), None, str(tmp_path / "staging"), None)
    conf = dict(op.conf or {})
    assert {key: conf[key] for key in SESSION_CONF} == SESSION_CONF and conf["spark.sql.ansi.enabled"] == "true"
