"""Airflow PostgreSQL connections with ``"iam": true``: the password is the postgres provider's IAM token.

A server of its own whose pg_hba asks one role for a SCRAM password (the suite's servers trust every local
connection, which would accept any password). The RDS token is the real one: ``PostgresHook.get_iam_token`` →
the Amazon provider's ``AwsBaseHook`` → boto3's ``generate_db_auth_token``, signed locally with the AWS
connection's keys (no AWS call). The server is told that token as the role's password just before it is
used: a connection that did not carry exactly that token is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from urllib.parse import parse_qs, urlsplit

import psycopg2
import pytest

from airflow_provider_pglogical.hooks.airflow_connection import connection_dsn
from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
from airflow_provider_pglogical.pipeline.spec import parse_spec
from airflow_provider_pglogical.pipeline.target import spec_target
from scripts.harness.pgserver import PgServer, execute, query, start_server, stop_server

ROLE, DBNAME = "iam_app", "app"
ACCESS_KEY, SECRET_KEY, REGION = "AKIAPGLOGICALTEST", "pglogical-iam-secret", "eu-west-1"


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    server = start_server()
    try:
        admin = server.dsn()
        execute(admin, f"CREATE ROLE {ROLE} LOGIN REPLICATION", f"CREATE DATABASE {DBNAME} OWNER {ROLE}")
        hba = server.data_dir / "pg_hba.conf"
        # As root the data directory belongs to the postgres OS user: rewrite in place, keeping the owner.
        hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        execute(admin, "SELECT pg_reload_conf()")
        yield server
    finally:
        stop_server(server)


@pytest.fixture
def connections(server, monkeypatch) -> dict[str, str]:
    """The IAM connection and its AWS connection as a deployment gives them (``AIRFLOW_CONN_*``); no ``AWS_*``."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION",
                 "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "AIRFLOW_CONN_PG_IAM": json.dumps({
            "conn_type": "postgres", "host": server.host, "port": server.port, "login": ROLE, "schema": DBNAME,
            "extra": {"iam": True, "aws_conn_id": "rds_auth", "sslmode": "disable", "application_name": "iam-test"}}),
        "AIRFLOW_CONN_RDS_AUTH": json.dumps({"conn_type": "aws", "login": ACCESS_KEY, "password": SECRET_KEY,
                                             "extra": {"region_name": REGION}}),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def accept_token(server: PgServer, token: str) -> None:
    """What RDS does for a valid token, done the only way a plain server can: make it the role's password."""
    execute(server.dsn(), f"ALTER ROLE {ROLE} PASSWORD %s", params=(token,))


def dsn_fields(dsn: str) -> dict[str, str]:
    conn = psycopg2.extensions.parse_dsn(dsn)
    return dict(conn)


def assert_rds_token(token: str, server: PgServer) -> None:
    """An RDS IAM auth token for this host, port and user, signed with the AWS connection's key."""
    parts = urlsplit("https://" + token)
    query_args = parse_qs(parts.query)
    assert parts.netloc == f"{server.host}:{server.port}"
    assert query_args["Action"] == ["connect"] and query_args["DBUser"] == [ROLE]
    assert query_args["X-Amz-Credential"][0].startswith(f"{ACCESS_KEY}/") and f"/{REGION}/rds-db/" in \
        query_args["X-Amz-Credential"][0]


def test_the_server_refuses_the_role_without_its_current_password(server, connections):
    accept_token(server, "some-earlier-token")
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(server.dsn(DBNAME, user=ROLE, password="not-the-token")).close()


def test_the_slot_hook_connects_with_the_postgres_providers_iam_token(server, connections):
    tokens: list[str] = []

    class ServerAcceptsTheToken(PgLogicalHook):
        def get_iam_token(self, conn):  # the provider's real token; the server then accepts exactly it
            login, token, port = super().get_iam_token(conn)
            accept_token(server, token)
            tokens.append(token)
            return login, token, port

    accept_token(server, "some-earlier-token")
    with ServerAcceptsTheToken(postgres_conn_id="pg_iam") as hook:
        hook.check_wal_level()  # opens the session: SCRAM with the token as password
        cur = hook.session.cursor()
        cur.execute("SELECT current_user, current_setting('application_name')")
        assert cur.fetchone() == (ROLE, "iam-test")  # the allow-listed extras kept beside the token
    [token] = tokens
    assert_rds_token(token, server)


def test_a_target_conn_id_with_iam_becomes_a_dsn_whose_password_is_the_token(server, connections):
    spec = parse_spec({"source": {"dsn": server.dsn(), "publication": "p", "slot": "s"},
                       "staging": {"uri": "/tmp/unused"}, "target": {"kind": "postgres", "conn_id": "pg_iam"},
                       "tables": {"public.t": {}}}, env={})
    dsn = spec_target(spec).dsn  # what the CLI's apply and the pipeline's bookkeeping connect with
    fields = dsn_fields(dsn)
    assert (fields["user"], fields["dbname"], fields["sslmode"]) == (ROLE, DBNAME, "disable")
    assert "iam" not in fields and "aws_conn_id" not in fields
    assert_rds_token(fields["password"], server)
    accept_token(server, fields["password"])
    assert query(dsn, "SELECT current_user") == [(ROLE,)]
    # the apply operator's spark-submit environment gets the same kind of DSN, with a token of its own
    other = dsn_fields(connection_dsn("pg_iam"))
    assert_rds_token(other["password"], server)
    assert {k: v for k, v in other.items() if k != "password"} == {k: v for k, v in fields.items() if k != "password"}
