"""Triggers run by Airflow's triggerer for deferred sensors (no worker slot held while waiting)."""
