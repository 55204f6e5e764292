"""Spark application: apply a slot's staged batches to a PostgreSQL target (thin; logic lives in the package)."""

import sys

from airflow_provider_pglogical.apply.app import main

if __name__ == "__main__":
    sys.exit(main())
