"""Asset URI schemes this provider registers with Airflow (``pglogical://``)."""
