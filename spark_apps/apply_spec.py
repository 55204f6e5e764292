"""Spark application: apply a pipeline spec's staged batches into its target, e.g. a Delta target on a classic
cluster (thin; logic lives in the package, ``pipeline/spec_app.py``)."""

import sys

from airflow_provider_pglogical.pipeline.spec_app import main

if __name__ == "__main__":
    sys.exit(main())
