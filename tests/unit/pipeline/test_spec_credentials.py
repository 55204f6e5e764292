"""The spec's `target.session_replication_role` and `staging.conn_id`, carried to the apply app, the DAG's tasks
and the staging filesystem (no services)."""

from __future__ import annotations

import copy
from datetime import datetime

import pyarrow.fs as pafs
import pytest

from airflow_provider_pglogical.apply.app import parse_args
from airflow_provider_pglogical.apply.config import ApplyConfig
from airflow_provider_pglogical.exceptions import ApplyError, SpecError, StagingError
from airflow_provider_pglogical.pipeline.dag_factory import build_pipeline_dag
from airflow_provider_pglogical.pipeline.runs import apply_config
from airflow_provider_pglogical.pipeline.spec import parse_spec
from airflow_provider_pglogical.staging.credentials import StorageCredentials, registered_filesystem, use_credentials
from airflow_provider_pglogical.staging.layout import resolve_filesystem

DOC = {
    "source": {"conn_id": "src", "publication": "p", "slot": "s"},
    "staging": {"uri": "s3://bucket/staging", "conn_id": "staging_s3"},
    "target": {"kind": "postgres", "conn_id": "dw", "session_replication_role": "replica"},
    "tables": {"public.orders": {}},
}


def doc_with(section: str, **values) -> dict:
    doc = copy.deepcopy(DOC)
    doc[section] = {**doc[section], **values}
    return doc


def spec_error(doc) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(doc, origin="p.yaml", env={})
    return str(info.value)


def test_the_replication_role_and_the_staging_connection_are_read_from_the_spec():
    spec = parse_spec(DOC, env={})
    assert spec.target.session_replication_role == "replica" and spec.staging.conn_id == "staging_s3"
    assert apply_config(spec).session_replication_role == "replica"
    plain = parse_spec(doc_with("target", session_replication_role=None), env={})
    assert plain.target.session_replication_role == "origin"


def test_a_replication_role_postgres_does_not_have_or_on_a_delta_target_is_refused():
    assert "target.session_replication_role: must be one of origin, replica, got 'local'" in \
        spec_error(doc_with("target", session_replication_role="local"))
    delta = {"kind": "delta", "uri": "/lake", "session_replication_role": "replica"}
    assert "target.session_replication_role: only for kind: postgres" in spec_error({**DOC, "target": delta})
    with pytest.raises(ApplyError, match="session_replication_role must be one of origin, replica"):
        ApplyConfig(slot="s", staging_root="/x", session_replication_role="local")


def test_a_staging_connection_is_for_an_object_store_root():
    assert "staging.conn_id: a staging connection is for an object-store uri (s3://, gs://, abfs://, az://)" in \
        spec_error(doc_with("staging", uri="/var/staging"))
    for uri in ("gs://bucket/staging", "abfs://c@acct.dfs.core.windows.net/staging", "az://c/staging"):
        assert parse_spec(doc_with("staging", uri=uri), env={}).staging.conn_id == "staging_s3"
    with pytest.raises(StagingError, match="for s3/s3a:// roots; /var/staging is a local path"):
        with use_credentials("/var/staging", StorageCredentials(access_key="k", secret_key="s")):
            pass


def test_the_apply_app_and_the_dags_tasks_carry_both_settings():
    assert parse_args(["--slot", "s", "--staging-root", "/x", "--session-replication-role", "replica"]) \
        .session_replication_role == "replica"
    assert parse_args(["--slot", "s", "--staging-root", "/x"]).session_replication_role == "origin"
    dag = build_pipeline_dag(parse_spec(DOC, env={}), dag_id="d", start_date=datetime(2026, 1, 1))
    decode, apply = dag.get_task("pglogical.decode"), dag.get_task("pglogical.apply")
    assert decode.staging_conn_id == apply.staging_conn_id == "staging_s3"
    args = apply.application_arguments()
    assert args[args.index("--session-replication-role") + 1] == "replica"
    origin = build_pipeline_dag(parse_spec(doc_with("target", session_replication_role="origin"), env={}),
                                dag_id="d", start_date=datetime(2026, 1, 1))
    assert "--session-replication-role" not in origin.get_task("pglogical.apply").application_arguments()


def test_registered_credentials_build_the_filesystem_of_uris_under_their_root_only(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    creds = StorageCredentials(access_key="key", secret_key="secret", region="eu-west-1",
                               endpoint_url="http://127.0.0.1:9000")
    assert "secret" not in repr(creds) and "key" not in repr(creds).replace("access_key", "")
    with use_credentials("s3://bucket/staging/", creds):
        fs, path = resolve_filesystem("s3://bucket/staging/slot")
        assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/staging/slot" and fs.region == "eu-west-1"
        assert registered_filesystem("s3://bucket/staging2") is None  # not under the registered root
    assert registered_filesystem("s3://bucket/staging/slot") is None  # only during the block
    assert creds.environment() == {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret",
                                   "AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "eu-west-1",
                                   "AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}
