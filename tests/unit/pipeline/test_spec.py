"""Pipeline spec loading and validation: every key, every error path, with the key path in the message."""

from __future__ import annotations

import copy
import json

import pytest

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.pipeline import spec as specmod
from airflow_provider_pglogical.pipeline.spec import load_spec, parse_size, parse_spec

VALID = {
    "source": {"dsn": "postgresql://replicator@db:5432/app", "publication": "app_pub", "slot": "app_slot",
               "create": True},
    "staging": {"uri": "/var/lib/pglogical/staging"},
    "target": {"kind": "postgres", "dsn": "postgresql://loader@warehouse:5432/dw"},
    "tables": {
        "public.orders": {"row_filter": "amount > 100 AND region = 'EU'", "columns": ["id", "amount", "region", "note"],
                          "target": "public.orders_eu"},
        "public.customers": {},
    },
    "truncate": {"cascade": "follow_source"},
}


def with_change(path: str, value, *, delete: bool = False) -> dict:
    doc = copy.deepcopy(VALID)
    *parents, last = path.split("/")
    node = doc
    for key in parents:
        node = node[key]
    if delete:
        del node[last]
    else:
        node[last] = value
    return doc


def error_of(doc, env=None) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(doc, origin="p.yaml", env=env or {})
    return str(info.value)


def test_the_example_spec_validates_into_dataclasses():
    spec = parse_spec(VALID, env={})
    assert spec.source.slot == "app_slot" and spec.source.create is True
    assert spec.source.dsn.startswith("postgresql://") and spec.source.conn_id is None
    assert spec.tables["public.orders"].columns == ("id", "amount", "region", "note")
    assert spec.tables["public.orders"].target_name == "public.orders_eu"
    assert spec.tables["public.customers"].target_name == "public.customers"
    assert spec.truncate.cascade == "follow_source"
    assert spec.spark.conn_id is None and spec.spark.submit_conn_id == "spark_default"


def test_a_yaml_file_and_a_json_file_load_the_same_spec(tmp_path):
    import yaml

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(VALID))
    (tmp_path / "p.json").write_text(json.dumps(VALID))
    a, b = load_spec(tmp_path / "p.yaml", env={}), load_spec(tmp_path / "p.json", env={})
    assert a.tables == b.tables and a.source == b.source


def test_a_missing_file_is_a_spec_error_naming_the_file(tmp_path):
    with pytest.raises(SpecError, match="nope.yaml: cannot read spec"):
        load_spec(tmp_path / "nope.yaml")


def test_invalid_yaml_is_a_spec_error_with_its_line(tmp_path):
    (tmp_path / "bad.yaml").write_text("source:\n  slot: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: not valid YAML/JSON at line \d+"):
        load_spec(tmp_path / "bad.yaml")


def test_a_misspelled_table_key_names_its_path_and_suggests_the_right_key():
    doc = with_change("tables/public.orders/colums", ["id"])
    assert "tables.public.orders.colums: unknown key (did you mean 'columns'?)" in error_of(doc)


def test_an_unknown_key_without_a_close_match_lists_the_allowed_keys():
    assert "staging.zzz: unknown key (allowed: uri, conn_id, retention)" in error_of(with_change("staging/zzz", 1))


def test_an_unknown_top_level_key_is_reported():
    assert "sorce: unknown key (did you mean 'source'?)" in error_of(with_change("sorce", {}))


def test_every_problem_is_reported_in_one_error():
    doc = with_change("tables/public.orders/colums", ["id"])
    doc["source"]["create"] = "yes"
    message = error_of(doc)
    assert "colums" in message and "source.create: expected true or false, got a string" in message


def test_a_spec_that_is_not_a_mapping_is_rejected():
    assert "expected a mapping, got a list" in error_of([1, 2])


@pytest.mark.parametrize("section", ["source", "staging", "target", "tables"])
def test_a_missing_required_section_is_reported_once(section):
    message = error_of(with_change(section, None, delete=True))
    hint = " (or targets:, docs/targets.md)" if section == "target" else ""
    assert message == f"p.yaml: {section}: required key is missing{hint}"


def test_a_missing_slot_and_publication_are_reported():
    doc = with_change("source/slot", None, delete=True)
    del doc["source"]["publication"]
    message = error_of(doc)
    assert "source.publication: required key is missing" in message
    assert "source.slot: required key is missing" in message


def test_source_needs_exactly_one_of_dsn_or_conn_id():
    assert "source: one of dsn or conn_id is required" in error_of(with_change("source/dsn", None, delete=True))
    assert "source: give either dsn or conn_id, not both" in error_of(with_change("source/conn_id", "pg"))


def test_target_needs_exactly_one_of_dsn_or_conn_id():
    assert "target: one of dsn or conn_id is required" in error_of(with_change("target/dsn", None, delete=True))


def test_a_conn_id_source_is_accepted():
    doc = with_change("source/dsn", None, delete=True)
    doc["source"]["conn_id"] = "pglogical_source"
    assert parse_spec(doc, env={}).source.conn_id == "pglogical_source"


def test_a_slot_name_postgres_would_reject_is_an_error():
    assert "source.slot: invalid replication slot name 'App-Slot'" in error_of(with_change("source/slot", "App-Slot"))


def test_a_publication_name_longer_than_namedatalen_is_an_error():
    assert "source.publication: longer than 63 bytes" in error_of(with_change("source/publication", "p" * 64))


def test_a_string_where_a_mapping_belongs_is_a_type_error():
    assert "staging: expected a mapping, got a string" in error_of(with_change("staging", "/tmp/x"))


def test_a_number_where_a_string_belongs_is_a_type_error():
    assert "staging.uri: expected a string, got a number" in error_of(with_change("staging/uri", 5))


def test_an_empty_string_is_an_error():
    assert "source.publication: must not be empty" in error_of(with_change("source/publication", " "))


def test_an_unknown_target_kind_is_an_error():
    assert "target.kind: must be one of postgres, delta, iceberg, got 'mysql'" in error_of(with_change("target/kind", "mysql"))


def test_an_unknown_truncate_cascade_policy_is_an_error():
    message = error_of(with_change("truncate/cascade", "always"))
    assert "truncate.cascade: must be one of follow_source, never, got 'always'" in message


def test_tables_must_not_be_empty():
    assert "tables: list at least one table as schema.table" in error_of(with_change("tables", {}))


def test_tables_must_be_a_mapping():
    assert "tables: expected a mapping of schema.table to settings, got a list" in error_of(
        with_change("tables", ["public.orders"]))


def test_an_unqualified_table_name_is_an_error():
    assert "tables.orders: table names must be schema.table" in error_of(with_change("tables/orders", {}))


def test_an_unqualified_target_name_is_an_error():
    assert "tables.public.orders.target: must be schema.table" in error_of(
        with_change("tables/public.orders/target", "orders_eu"))


def test_two_tables_with_the_same_target_are_an_error():
    message = error_of(with_change("tables/public.customers/target", "public.orders_eu"))
    assert "tables.public.customers: target public.orders_eu is also the target of public.orders" in message


def test_columns_must_be_a_non_empty_list_of_unique_names():
    assert "tables.public.orders.columns: expected a non-empty list of column names, got a string" in error_of(
        with_change("tables/public.orders/columns", "id"))
    assert "tables.public.orders.columns[1]: column 'id' is listed twice" in error_of(
        with_change("tables/public.orders/columns", ["id", "id"]))
    assert "tables.public.orders.columns[0]: expected a column name, got a number" in error_of(
        with_change("tables/public.orders/columns", [1]))


def test_key_columns_must_be_among_the_listed_columns():
    assert "tables.public.orders.key_columns: key column 'sku' is not in columns" in error_of(
        with_change("tables/public.orders/key_columns", ["sku"]))


def test_actions_and_schema_changes_are_per_table_choices():
    spec = parse_spec(with_change("tables/public.customers", {"actions": ["truncate", "insert"],
                                                              "schema_changes": "fail"}), env={})
    assert spec.tables["public.customers"].actions == ("insert", "truncate")  # canonical order
    assert spec.tables["public.customers"].schema_changes == "fail"
    assert spec.tables["public.orders"].actions == ("insert", "update", "delete", "truncate")
    assert spec.tables["public.orders"].schema_changes == "follow"
    assert parse_spec(with_change("tables/public.customers", {"actions": []}), env={}) \
        .tables["public.customers"].actions == ()
    message = error_of(with_change("tables/public.customers", {"actions": ["insert", "upsert", "insert"],
                                                               "schema_changes": "ignore"}))
    assert "tables.public.customers.actions[1]: must be one of insert, update, delete, truncate, got 'upsert'" \
        in message
    assert "tables.public.customers.actions[2]: action 'insert' is listed twice" in message
    assert "tables.public.customers.schema_changes: must be one of follow, fail, got 'ignore'" in message
    assert "tables.public.customers.actions: expected a list" in error_of(
        with_change("tables/public.customers", {"actions": "insert"}))


def test_table_selection_like_publications_with_named_overrides():
    doc = with_change("tables/*", {"conflict": "strict"})
    doc["tables"]["sales.*"] = {"actions": ["insert"]}
    doc["schemas"] = ["hr"]
    spec = parse_spec(doc, env={})
    assert sorted(spec.selectors) == ["*", "hr.*", "sales.*"]
    assert spec.selectors["*"].conflict == "strict" and spec.selectors["sales.*"].actions == ("insert",)
    assert sorted(spec.tables) == ["public.customers", "public.orders"]
    # schemas alone need no tables
    only = with_change("tables", None, delete=True)
    only["schemas"] = ["sales"]
    assert sorted(parse_spec(only, env={}).selectors) == ["sales.*"]
    # the apply gets them as wildcard entries, named entries first in precedence
    from airflow_provider_pglogical.pipeline.runs import apply_config

    config = apply_config(spec)
    assert config.table_config("sales.anything").actions == ("insert",)
    assert config.table_config("public.orders").target == "public.orders_eu"
    assert config.table_config("other.t").conflict == "strict"


def test_table_selection_errors_are_clear():
    assert "tables.*.target: a selection keeps each table's own name" in error_of(
        with_change("tables/*", {"target": "public.all"}))
    assert 'tables.a.b.*: a selection is "*" or schema.*' in error_of(with_change("tables/a.b.*", {}))
    doc = with_change("tables/sales.*", {})
    doc["schemas"] = ["sales", "x.y", 3]
    message = error_of(doc)
    assert "schemas[0]: schema 'sales' is selected twice (schemas and tables.sales.*)" in message
    assert "schemas[1]: expected a schema name (no dots)" in message and "schemas[2]:" in message
    assert "schemas: expected a non-empty list of schema names" in error_of(with_change("schemas", []))
    assert "tables: list at least one table as schema.table" in error_of(with_change("tables", {}))


def test_resolving_a_selection_against_the_publication():
    from airflow_provider_pglogical.pipeline.source import resolve

    doc = with_change("tables/*", {"unchanged_toast": "reject_and_continue"})
    doc["tables"]["sales.*"] = {"actions": ["insert"]}
    spec = parse_spec(doc, env={})
    published = {"public.orders", "public.customers", "sales.a", "hr.b"}
    got = resolve(spec, published)
    assert sorted(got.tables) == ["hr.b", "public.customers", "public.orders", "sales.a"]
    assert got.tables["public.orders"].target_name == "public.orders_eu"  # the named entry wins
    assert got.tables["sales.a"].actions == ("insert",) and got.tables["sales.a"].name == "sales.a"
    assert got.tables["hr.b"].unchanged_toast == "reject_and_continue" and got.tables["hr.b"].target_name == "hr.b"
    assert resolve(parse_spec(VALID, env={}), published).tables == parse_spec(VALID, env={}).tables
    # a selected table that is a named entry's target: two sources, one target
    with pytest.raises(SpecError, match=r"tables\.\* selects the published table public\.orders_eu, which is also "
                                        r"the target of tables\.public\.orders"):
        resolve(spec, published | {"public.orders_eu"})


def test_the_apply_config_carries_actions_and_schema_changes():
    from airflow_provider_pglogical.pipeline.runs import apply_config

    spec = parse_spec(with_change("tables/public.customers", {"actions": ["insert"], "schema_changes": "fail"}),
                      env={})
    cfg = apply_config(spec).tables["public.customers"]
    assert (cfg.actions, cfg.schema_changes) == (("insert",), "fail")


def test_an_unknown_conflict_policy_is_an_error():
    assert "tables.public.orders.conflict: must be one of upsert, strict, got 'ignore'" in error_of(
        with_change("tables/public.orders/conflict", "ignore"))


def test_a_row_filter_that_is_not_a_string_is_an_error():
    assert "tables.public.orders.row_filter: expected a string, got a boolean" in error_of(
        with_change("tables/public.orders/row_filter", True))


@pytest.mark.parametrize(("expression", "problem"), [
    ("amount > 100 AND region = 'EU", "does not parse: unterminated quoted string"),
    ("(amount > 100", "does not parse: syntax error at end of input"),
    ("amount > 100)", 'does not parse: syntax error at or near ")" (at character 13)'),
    ("amount > 100; DROP TABLE x", "must be a single expression"),
    ("/* ( */ true) OR (true /* ) */", 'does not parse: syntax error at or near ")" (at character 13)'),
    ("pg_sleep(0.2) IS NOT NULL", "function pg_sleep is not allowed (only immutable built-in functions)"),
    ("id > (SELECT v FROM public.secret WHERE id = 17)::int", "subqueries are not allowed"),
])
def test_a_row_filter_publication_rules_refuse_is_reported_at_load_with_its_path(expression, problem):
    assert f"tables.public.orders.row_filter: {problem}" in error_of(
        with_change("tables/public.orders/row_filter", expression))


def test_a_row_filter_is_kept_as_deparsed_from_its_parse_tree_without_comments():
    spec = parse_spec(with_change("tables/public.orders/row_filter", "(amount > 100) /* big */ AND region = 'EU' -- x"),
                      env={})
    assert spec.tables["public.orders"].row_filter == "amount > 100 AND region = 'EU'"


def test_a_row_filter_of_a_table_with_columns_may_use_only_those():
    assert "tables.public.orders.row_filter: references column(s) customer_id not in columns\n" in error_of(
        with_change("tables/public.orders/row_filter", "customer_id = 1")) + "\n"


def test_a_row_filter_names_a_mixed_case_column_quoted_as_postgresql_does():
    table = {"columns": ["id", "Region"], "row_filter": "\"Region\" = 'eu'"}
    assert parse_spec(with_change("tables/public.orders", table), env={}).tables["public.orders"].row_filter == \
        "\"Region\" = 'eu'"
    assert ('tables.public.orders.row_filter: references column(s) region not in columns: region matches "Region" '
            "apart from case: unquoted names fold to lower case, as in PostgreSQL; quote the column as spelled") in error_of(
        with_change("tables/public.orders", {**table, "row_filter": "Region = 'eu'"}))


def test_quotes_and_semicolons_inside_string_literals_are_fine_in_a_row_filter():
    spec = parse_spec(with_change("tables/public.orders/row_filter", "note = 'it''s; \"ok\" (really'"), env={})
    assert spec.tables["public.orders"].row_filter == "note = 'it''s; \"ok\" (really'"


def test_a_table_with_null_settings_uses_every_column_and_its_own_name():
    spec = parse_spec(with_change("tables/public.customers", None), env={})
    table = spec.tables["public.customers"]
    assert table.columns is None and table.row_filter is None and table.target_name == "public.customers"


def test_environment_variables_are_substituted_in_strings():
    doc = with_change("staging/uri", "${STAGE_ROOT}/stage")
    doc["target"]["dsn"] = "${TARGET_DSN:-postgresql://localhost/dw}"
    spec = parse_spec(doc, env={"STAGE_ROOT": "/data"})
    assert spec.staging.uri == "/data/stage" and spec.target.dsn == "postgresql://localhost/dw"


def test_an_unset_environment_variable_without_default_is_an_error():
    assert "staging.uri: environment variable STAGE_ROOT is not set" in error_of(
        with_change("staging/uri", "${STAGE_ROOT}/stage"))


@pytest.mark.parametrize(("text", "expected"), [(1024, 1024), ("512MB", 512 * 1024**2), ("1 GiB", 1024**3),
                                                ("64k", 65536), ("10", 10)])
def test_byte_sizes_accept_numbers_and_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", -1, True, 1.5])
def test_a_malformed_byte_size_is_an_error(bad):
    message = error_of(with_change("source/max_batch_bytes", bad))
    assert "source.max_batch_bytes:" in message


def test_limits_must_be_positive():
    assert "source.max_changes: must be greater than 0" in error_of(with_change("source/max_changes", 0))
    assert "source.max_changes: expected a positive integer, got a string" in error_of(
        with_change("source/max_changes", "10"))
    assert "source.max_batch_bytes: must be greater than 0" in error_of(with_change("source/max_batch_bytes", 0))


def test_wal_thresholds_parse_as_byte_sizes():
    doc = with_change("source/min_safe_wal_bytes", "1GB")
    doc["source"]["max_lag_bytes"] = 0
    spec = parse_spec(doc, env={})
    assert spec.source.min_safe_wal_bytes == 1024**3 and spec.source.max_lag_bytes == 0


def test_spark_settings_are_validated():
    spec = parse_spec(with_change("spark", {"master": "local[2]", "conf": {"spark.sql.shuffle.partitions": 4}}),
                      env={})
    assert spec.spark.master == "local[2]" and spec.spark.conf == {"spark.sql.shuffle.partitions": "4"}
    assert "spark.conf: expected a mapping of Spark settings, got a list" in error_of(
        with_change("spark", {"conf": ["x"]}))


def test_the_spec_choices_match_the_apply_package():
    from airflow_provider_pglogical.apply import config

    assert specmod.CONFLICT_POLICIES == config.CONFLICT_POLICIES
    assert specmod.TOAST_POLICIES == config.TOAST_POLICIES
    assert specmod.TRUNCATE_CASCADE == config.CASCADE_POLICIES
    assert specmod.ACTIONS == config.ACTIONS
    assert specmod.SCHEMA_CHANGE_POLICIES == config.SCHEMA_CHANGE_POLICIES


def test_the_snapshot_section_defaults_to_no_initial_snapshot_and_validates_its_keys():
    spec = parse_spec(copy.deepcopy(VALID), env={})
    assert (spec.snapshot.initial, spec.snapshot.parallelism, spec.snapshot.chunk_size) == (False, 1, 256 << 20)
    doc = copy.deepcopy(VALID)
    doc["snapshot"] = {"initial": True, "parallelism": 4, "chunk_size": "64MB"}
    spec = parse_spec(doc, env={})
    assert (spec.snapshot.initial, spec.snapshot.parallelism, spec.snapshot.chunk_size) == (True, 4, 64 << 20)
    doc["snapshot"] = {"initial": "yes", "parallelism": 0, "chunk_size": "10k", "chunks": 3}
    with pytest.raises(SpecError) as err:
        parse_spec(doc, env={})
    text = str(err.value)
    assert "snapshot.initial: expected true or false" in text
    assert "snapshot.parallelism: must be greater than 0" in text
    assert "snapshot.chunk_size: must be at least 1MB" in text
    assert "snapshot.chunks: unknown key" in text


def test_a_delta_change_feed_refuses_an_initial_snapshot_a_mirror_loads_it():
    doc = copy.deepcopy(VALID)
    doc["target"] = {"kind": "delta", "uri": "s3://lake/cdc", "mode": "changelog"}
    doc["snapshot"] = {"initial": True}
    assert "snapshot.initial: a delta target loads snapshots in mode: mirror only" in error_of(doc)
    doc["target"]["mode"] = "mirror"
    assert parse_spec(doc, env={}).snapshot.initial
    doc["snapshot"] = {"initial": False, "parallelism": 2}
    assert parse_spec(doc, env={}).snapshot.parallelism == 2


def test_a_resync_on_a_delta_change_feed_is_refused_before_anything_is_requested(tmp_path):
    from airflow_provider_pglogical.pipeline.snapshots import sync_tables

    doc = copy.deepcopy(VALID)
    doc["target"] = {"kind": "delta", "uri": str(tmp_path / "lake"), "mode": "changelog"}
    doc["staging"] = {"uri": str(tmp_path / "staging")}
    with pytest.raises(SpecError, match="resync of public.customers: a delta target loads snapshots in mode: mirror"):
        sync_tables(parse_spec(doc, env={}), resync=["public.customers"])
    assert not (tmp_path / "staging").exists()


def test_several_publications_are_decoded_together():
    from airflow_provider_pglogical.pipeline.runs import drain_config

    doc = with_change("source/publication", ["pub_a", "pub_b"])
    doc["source"]["create"] = False
    spec = parse_spec(doc, env={})
    assert spec.source.publication == "pub_a" and spec.source.all_publications == ("pub_a", "pub_b")
    assert drain_config(spec).publications == ("pub_a", "pub_b")
    assert parse_spec(VALID, env={}).source.all_publications == ("app_pub",)
    message = error_of(with_change("source/publication", ["a", "a", "b,c", ""]))
    assert "source.create: creates one publication; with several, create them yourself" in message
    assert "source.publication[1]: publication 'a' is listed twice" in message
    assert "source.publication[2]: a publication name in a list cannot contain" in message
    assert "source.publication[3]: expected a publication name" in message
    doc["snapshot"] = {"initial": True}  # snapshots read the publications' union (snapshot/source.py)
    assert parse_spec(doc, env={}).snapshot.initial


def test_spark_remote_is_a_spark_connect_url_and_excludes_master():
    spec = parse_spec(with_change("spark", {"remote": "sc://spark:15002", "conf": {"spark.sql.ansi.enabled": "true"}}),
                      env={})
    assert (spec.spark.remote, spec.spark.master, spec.spark.where) == ("sc://spark:15002", None, "sc://spark:15002")
    assert "spark.remote: expected a Spark Connect URL sc://host:port" in error_of(
        with_change("spark", {"remote": "spark://master:7077"}))
    assert "spark.remote: give either master" in error_of(
        with_change("spark", {"remote": "sc://spark:15002", "master": "local[2]"}))
    assert parse_spec(with_change("spark", {"master": "local[2]"}), env={}).spark.where == "local[2]"


@pytest.mark.parametrize(("key", "value", "way_out"), [("spark.master", "spark://h:7077", "master"),
                                                        ("spark.remote", "sc://h:15002", "remote")])
def test_where_spark_runs_is_refused_in_spark_conf_and_its_own_key_holds(key, value, way_out):
    # Applied after the master, such a setting would give the run another session than the one it decides with.
    message = error_of(with_change("spark", {"conf": {key: value, "spark.sql.ansi.enabled": "true"}}))
    assert f"spark.conf.{key}: where Spark runs is not a conf setting: give it as spark.{way_out}: instead" in message
    assert "\n" not in message and value not in message
    spec = parse_spec(with_change("spark", {way_out: value, "conf": {"spark.sql.ansi.enabled": "true"}}), env={})
    assert spec.spark.where == value and spec.spark.conf == {"spark.sql.ansi.enabled": "true"}


def test_a_session_setting_the_apply_relies_on_is_refused_in_spark_conf_unless_it_says_the_same():
    # each would break exactness silently: names merged by case, ``${…}`` in a quoted name substituted, a staged
    # timestamp without time zone read as local time (a lake table then typed otherwise), bytes read as text
    conf = {"spark.sql.caseSensitive": False, "spark.sql.variable.substitute": "true",
            "spark.sql.session.timeZone": "Europe/Paris", "spark.sql.ansi.enabled": "true",
            "spark.sql.parquet.inferTimestampNTZ.enabled": False, "spark.sql.parquet.binaryAsString": "true"}
    message = error_of(with_change("spark", {"conf": conf}))
    for key, value in (("spark.sql.caseSensitive", "true"), ("spark.sql.variable.substitute", "false"),
                       ("spark.sql.session.timeZone", "UTC"), ("spark.sql.parquet.inferTimestampNTZ.enabled", "true"),
                       ("spark.sql.parquet.binaryAsString", "false")):
        assert f"spark.conf.{key}: the apply sets it to {value}: leave it out" in message, message
    assert "spark.sql.ansi.enabled" not in message
    same = {"spark.sql.caseSensitive": True, "spark.sql.variable.substitute": "FALSE", "spark.sql.session.timeZone": "UTC"}
    assert parse_spec(with_change("spark", {"conf": same}), env={}).spark.conf["spark.sql.caseSensitive"] == "True"
