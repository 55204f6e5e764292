"""Airflow PostgreSQL connections with ``"iam": true``: the password is the postgres provider's IAM token.

A server of its own whose pg_hba asks one role for a SCRAM password (the suite's servers trust every local
connection, which would accept any password). The RDS token is the real one: ``PostgresHook.get_iam_token`` →
the Amazon provider's ``AwsBaseHook`` → boto3's ``generate_db_auth_token``, signed locally with the AWS
connection's keys (no AWS call). The server is told that token as the role's password just before it is
used: a connection that did not carry exactly that token is refused.
"""

from __future__ import annotations

import json
import uuid
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


# Microsoft Entra (Azure AD) tokens: ``"iam": true`` with ``azure_conn_id``. ``PostgresHook.get_iam_token`` hands such
# a connection to ``get_azure_iam_token`` (the Microsoft Azure provider asking Entra for a token). Neither the
# provider nor Entra is here, so that one method stands in for Entra with a fresh opaque token per call; the
# dispatch to it, and everything after it — the DSN built around the token and the SCRAM login with it on a real
# server — are the real code paths.

@pytest.fixture
def entra_connection(server, monkeypatch) -> str:
    monkeypatch.setenv("AIRFLOW_CONN_PG_ENTRA", json.dumps({
        "conn_type": "postgres", "host": server.host, "port": server.port, "login": ROLE, "schema": DBNAME,
        "extra": {"iam": True, "azure_conn_id": "entra_app", "sslmode": "disable"}}))
    return "pg_entra"


def entra_token_source(server: PgServer, calls: list[tuple[str, str]]):
    """What Entra and the Azure Database for PostgreSQL server do, done here: a new token per call, which the
    server then accepts as the role's password (and only it)."""
    def get_azure_iam_token(self, conn):
        token = f"eyJ0eXAiOiJKV1QifQ.entra-{len(calls)}-{uuid.uuid4().hex}"
        calls.append((conn.extra_dejson["azure_conn_id"], token))
        accept_token(server, token)
        return conn.login, token, conn.port or 5432
    return get_azure_iam_token


def test_the_slot_hook_connects_with_an_entra_token_when_the_connection_names_an_azure_connection(
        server, entra_connection, monkeypatch):
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(PostgresHook, "get_azure_iam_token", entra_token_source(server, calls))
    monkeypatch.setattr(PostgresHook, "get_aws_iam_token", lambda self, conn: pytest.fail("AWS path taken"))
    accept_token(server, "some-earlier-token")
    with PgLogicalHook(postgres_conn_id=entra_connection) as hook:
        hook.check_wal_level()  # opens the session: SCRAM with the Entra token as password
        cur = hook.session.cursor()
        cur.execute("SELECT current_user")
        assert cur.fetchone() == (ROLE,)
    assert [azure for azure, _ in calls] == ["entra_app"]


def test_a_target_conn_id_with_an_entra_token_becomes_a_dsn_whose_password_is_the_token(
        server, entra_connection, monkeypatch):
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    calls: list[tuple[str, str]] = []
    monkeypatch.setattr(PostgresHook, "get_azure_iam_token", entra_token_source(server, calls))
    spec = parse_spec({"source": {"dsn": server.dsn(), "publication": "p", "slot": "s"},
                       "staging": {"uri": "/tmp/unused"}, "target": {"kind": "postgres", "conn_id": entra_connection},
                       "tables": {"public.t": {}}}, env={})
    dsn = spec_target(spec).dsn
    fields = dsn_fields(dsn)
    [(azure, token)] = calls
    assert (azure, fields["password"], fields["user"], fields["dbname"]) == ("entra_app", token, ROLE, DBNAME)
    assert "azure_conn_id" not in fields and "iam" not in fields
    assert query(dsn, "SELECT current_user") == [(ROLE,)]
    other = dsn_fields(connection_dsn(entra_connection))  # asked again: a token of its own
    assert len(calls) == 2 and other["password"] == calls[1][1] != token
    with pytest.raises(psycopg2.OperationalError, match="password authentication failed"):
        psycopg2.connect(dsn).close()  # the first token is no longer the one the server takes
