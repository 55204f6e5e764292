"""SlotLagTrigger serialises to what the triggerer re-creates it from; the sensor turns its events back into results."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.exceptions import SlotError, SlotInvalidatedError
from airflow_provider_pglogical.sensors.slot_lag import SlotLagSensor
from airflow_provider_pglogical.triggers.slot_lag import SlotLagTrigger


def test_the_trigger_serialises_to_its_import_path_and_arguments_and_round_trips():
    from airflow.sdk._shared.module_loading import import_string

    trigger = SlotLagTrigger(slot="s1", max_lag_bytes=1024, postgres_conn_id="src", poll_interval=5,
                             min_safe_wal_bytes=10)
    path, kwargs = trigger.serialize()
    assert path == "airflow_provider_pglogical.triggers.slot_lag.SlotLagTrigger"
    again = import_string(path)(**kwargs)
    assert again.serialize() == (path, kwargs)
    assert kwargs == {"slot": "s1", "max_lag_bytes": 1024, "postgres_conn_id": "src", "poll_interval": 5.0,
                      "min_safe_wal_bytes": 10}


def test_the_provider_lists_its_trigger_module():
    from airflow_provider_pglogical import get_provider_info

    (entry,) = get_provider_info()["triggers"]
    assert entry["python-modules"] == ["airflow_provider_pglogical.triggers.slot_lag"]


def sensor() -> SlotLagSensor:
    return SlotLagSensor(task_id="lag", slot="s1", max_lag_bytes=0, deferrable=True)


def test_resuming_with_a_success_event_returns_the_slot_summary():
    assert sensor().execute_complete({}, {"status": "success", "lag_bytes": 0, "polls": 3, "slot": "s1"}) == \
        {"lag_bytes": 0, "polls": 3, "slot": "s1"}


def test_resuming_with_an_error_event_raises_the_slot_error_the_trigger_saw():
    with pytest.raises(SlotInvalidatedError, match="'s1' has been invalidated"):
        sensor().execute_complete({}, {"status": "error", "error_type": "SlotInvalidatedError",
                                       "message": "replication slot 's1' has been invalidated"})
    with pytest.raises(SlotError):  # an unknown name never becomes an arbitrary class
        sensor().execute_complete({}, {"status": "error", "error_type": "SystemExit", "message": "x"})
