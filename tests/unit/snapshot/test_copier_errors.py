"""How a failed snapshot COPY is reported: one line, the server's words, never a row's value."""

from __future__ import annotations

from airflow_provider_pglogical.snapshot.copier import server_error


def test_a_data_exception_is_named_by_its_condition_not_by_the_message_quoting_the_value():
    text = server_error("22P02", 'invalid input syntax for type integer: "hidden17"')
    assert text.startswith("SQLSTATE 22P02: invalid_text_representation while evaluating the row filter")
    assert "hidden17" not in text
    assert server_error("22999", 'value "hidden" is odd').startswith("SQLSTATE 22999: data_exception while")


def test_other_errors_keep_the_servers_primary_message_on_one_line():
    full = ('ERROR:  column "nope" does not exist\nLINE 1: ... WHERE ((nope > 1))\n        ^\n'
            'HINT:  Perhaps you meant to reference the column "parents.name".')
    assert server_error("42703", full.removeprefix("ERROR:").strip()) == 'SQLSTATE 42703: column "nope" does not exist'
    assert server_error(None, None) == "SQLSTATE : "
