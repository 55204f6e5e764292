"""What a spark-submit apply hands its process as environment: secrets only where they stay off the command line,
and never two values of one variable."""

from __future__ import annotations

import pytest

from airflow_provider_pglogical.exceptions import SpecError
from airflow_provider_pglogical.operators.apply import submit_secrets

STAGING = {"AWS_ACCESS_KEY_ID": "staging-id", "AWS_SECRET_ACCESS_KEY": "staging-secret"}


@pytest.mark.parametrize("master", ["local[2]", "spark://127.0.0.1:7077", ""])
def test_local_and_standalone_masters_get_the_staging_and_target_credentials_as_environment(master):
    target = {"PGLOGICAL_TARGET_DSN": "host=db password=pw"}
    assert submit_secrets(master, STAGING, target) == {**STAGING, **target}


@pytest.mark.parametrize("master", ["yarn", "yarn-client", "k8s://https://api.example:6443"])
def test_yarn_and_kubernetes_masters_are_refused_naming_the_variables_never_their_values(master):
    with pytest.raises(SpecError) as err:
        submit_secrets(master, STAGING, {"PGLOGICAL_TARGET_DSN": "host=db password=pw"})
    message = str(err.value)
    assert "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, PGLOGICAL_TARGET_DSN" in message and "command line" in message
    assert "staging-secret" not in message and "pw" not in message and "\n" not in message


def test_a_yarn_master_without_secrets_is_not_refused():
    assert submit_secrets("yarn", {}, {}) == {}


def test_staging_and_target_setting_one_variable_to_two_values_are_refused():
    lake = {"AWS_ACCESS_KEY_ID": "lake-id", "AWS_SECRET_ACCESS_KEY": "staging-secret"}
    with pytest.raises(SpecError, match=r"set AWS_ACCESS_KEY_ID to different values") as err:
        submit_secrets("local[2]", STAGING, lake)
    assert "lake-id" not in str(err.value) and "staging-id" not in str(err.value)
    assert submit_secrets("local[2]", STAGING, dict(STAGING)) == STAGING  # one connection for both: fine
