"""Pipeline specs and what is built from them: the run steps shared by the CLI and the DAG factory."""
