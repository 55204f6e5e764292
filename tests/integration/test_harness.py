"""The harness is real: a pgoutput slot on the suite's server returns binary-mode changes."""


def test_pgoutput_slot_returns_begin_relation_insert_commit_rows(pg_conn):
    cur = pg_conn.cursor()
    cur.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    cur.execute("CREATE PUBLICATION p FOR TABLE t")
    cur.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    cur.execute("INSERT INTO t VALUES (1, 'x')")
    cur.execute(
        "SELECT lsn, xid, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL,"
        " 'proto_version', '1', 'publication_names', 'p', 'binary', 'true')"
    )
    kinds = [bytes(row[2][:1]).decode() for row in cur.fetchall()]
    assert kinds == ["B", "R", "I", "C"]
