"""Operational signals: per-batch metrics through Airflow's ``Stats`` (progress lines for long steps: ``progress.py``)."""
