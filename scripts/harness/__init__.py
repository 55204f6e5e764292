"""Local services for development, shared by the tests, the benchmarks and ``make demo``: throwaway PostgreSQL
servers and databases on them (``pgserver``), a native subscriber next to the pipeline (``subscriber``), commands
run the way a user runs them (``userenv``).

Not part of the installed package (the wheel ships ``airflow_provider_pglogical`` only) and never imports
``tests``: the benchmarks and the demo run from a checkout without the test suite's fixtures.
"""
