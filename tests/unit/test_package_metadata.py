"""The installed distribution describes itself as a PyPI package should, and the CLI reports its version."""

from __future__ import annotations

import sysconfig
from importlib import metadata
from pathlib import Path

import yaml

import airflow_provider_pglogical
from scripts.harness.userenv import run_as_user, venv_script
from scripts.test_dist import WITHOUT_SPARK

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


def test_pyspark_is_an_extra_and_airflow_a_lower_bound_with_every_supported_python_declared():
    meta = installed().metadata
    requires = meta.get_all("Requires-Dist", [])
    # The tested range's lower bound (make test-spark-versions), no cap: nothing newer is known to break.
    assert {r for r in requires if r.startswith("pyspark")} == {'pyspark>=4.0.5; extra == "spark"'}
    (airflow,) = [r for r in requires if r.startswith("apache-airflow>") or r.startswith("apache-airflow=")]
    assert airflow.startswith("apache-airflow>=") and "<" not in airflow
    assert meta["Requires-Python"] == ">=3.11"
    classifiers = meta.get_all("Classifier", [])
    assert {f"Programming Language :: Python :: 3.{m}" for m in (11, 12, 13)} <= set(classifiers)


NO_SPARK = WITHOUT_SPARK + """
print(sorted(m for m in sys.modules if m.partition(".")[0] in ("pyspark", "py4j")))
"""


def test_the_package_cli_operators_and_dag_factory_load_without_pyspark():
    """Without the [spark] extra a worker has no Spark (or only the provider's pyspark-client): loading works."""
    result = run_as_user([venv_script("python"), "-c", NO_SPARK], timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


def test_the_readme_pypi_shows_links_only_to_absolute_urls():
    """The README is the package's long description: on PyPI a relative link (``docs/apply.md``) is dead."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    relative = [target for target in re.findall(r"\]\(([^)]+)\)", readme)
                if not target.startswith(("https://", "http://", "#", "mailto:"))]
    assert not relative, f"relative links in README.md: {relative}"


def test_the_hosted_docs_build_installs_the_locked_site_tools_and_builds_strict_as_make_docs_does():
    """Read the Docs (the site_url) builds the same mkdocs.yml with warnings as errors, with the lock's versions."""
    root = Path(__file__).resolve().parents[2]
    config = yaml.safe_load((root / ".readthedocs.yaml").read_text())
    assert config["mkdocs"] == {"configuration": "mkdocs.yml", "fail_on_warning": True}
    requirements = [entry["requirements"] for entry in config["python"]["install"]]
    locked = dict(line.split("==", 1) for line in (root / "constraints.txt").read_text().splitlines() if "==" in line)
    pins = [line for path in requirements for line in (root / path).read_text().splitlines()
            if line and not line.startswith("#")]
    assert {"mkdocs", "mkdocs-material", "mkdocstrings-python"} <= {pin.split("==")[0] for pin in pins}
    for pin in pins:
        name, version = pin.split("==", 1)
        assert locked.get(name) == version, (pin, locked.get(name))
    assert yaml.safe_load((root / "mkdocs.yml").read_text().replace("!!python", "#"))["site_url"].startswith(
        "https://airflow-provider-pglogical.readthedocs.io/")
