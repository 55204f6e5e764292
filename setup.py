"""Builds the optional C helpers; everything else is in pyproject.toml.

``optional=True``: without a compiler (or Python headers) the install still succeeds and the
package uses its pure-Python paths (``airflow_provider_pglogical.decoding.speedups`` says which).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("airflow_provider_pglogical.decoding._speedups", ["airflow_provider_pglogical/decoding/_speedups.c"],
              extra_compile_args=["-O2"], optional=True),
])
