"""What a command imported: the modules a real process (``airflow dags test``, a task) had loaded when it exited."""

from __future__ import annotations

from pathlib import Path

RECORDER = Path(__file__).parent / "import_recorder"
# What a DAG parse or a pipeline run with nothing to do must not import: seconds of start-up each (pyspark: the Spark
# apply; pandas: pyarrow's pandas shim and dataset reads; the lake targets' libraries).
HEAVY = ("pyspark", "pandas", "deltalake", "pyiceberg")


def recording_env(record: Path) -> dict[str, str]:
    """Variables making a command's Python processes record their modules into ``record`` at exit (and the stacks
    that first imported a :data:`HEAVY` package into ``record.stacks``)."""
    return {"PYTHONPATH": str(RECORDER), "PGLOGICAL_IMPORTED_MODULES": str(record),
            "PGLOGICAL_WATCHED_IMPORTS": ",".join(HEAVY)}


def heavy_imports(record: Path) -> list[str]:
    """The :data:`HEAVY` packages among the modules the command recorded (fails when it recorded none), each with
    the stack that imported it first when one was recorded (what to make lazy)."""
    modules = set(record.read_text().split())
    assert modules, f"no modules recorded in {record}"
    heavy = sorted({m.split(".")[0] for m in modules if m.split(".")[0] in HEAVY})
    stacks = record.with_name(record.name + ".stacks")
    if heavy and stacks.exists():
        print(stacks.read_text())  # pytest shows it with the failure
    return heavy
