"""Operational signals: per-batch metrics through Airflow's ``Stats`` and progress lines for long steps."""
