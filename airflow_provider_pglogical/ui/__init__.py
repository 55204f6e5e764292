"""The Airflow UI view: each pipeline's run report served by the api-server (an Airflow 3 plugin)."""
