"""The installed distribution describes itself as a PyPI package should, and the CLI reports its version."""

from __future__ import annotations

import sysconfig
from importlib import metadata

import airflow_provider_pglogical
from scripts.harness.userenv import run_as_user, venv_script

DIST = "airflow-provider-pglogical"


def installed() -> metadata.Distribution:
    """The venv's installed copy (a checkout's build leaves an ``.egg-info`` that ``sys.path`` finds first)."""
    found = list(metadata.distributions(name=DIST, path=[sysconfig.get_paths()["purelib"]]))
    assert len(found) == 1, found
    return found[0]


def test_pglogical_version_prints_the_installed_distributions_version():
    result = run_as_user([venv_script("pglogical"), "--version"], timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"pglogical {installed().version}"
    assert installed().version == airflow_provider_pglogical.__version__


def test_the_distribution_carries_its_license_file_and_provider_classifiers():
    dist = installed()
    meta = dist.metadata
    assert meta["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in meta.get_all("License-File", [])
    classifiers = meta.get_all("Classifier", [])
    assert "Framework :: Apache Airflow :: Provider" in classifiers
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in classifiers)
    license_text = dist.read_text("licenses/LICENSE") or ""
    assert "Apache License" in license_text and "Version 2.0" in license_text
