"""What a command imported: the modules a real process (``airflow dags test``, a task) had loaded when it exited."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

RECORDER = Path(__file__).parent / "import_recorder"
# What a DAG parse or a pipeline run with nothing to do must not import: seconds of start-up each (pyspark: the Spark
# apply; pandas: pyarrow's pandas shim and dataset reads; the lake targets' libraries).
HEAVY = ("pyspark", "pandas", "deltalake", "pyiceberg")


def recording_env(record: Path, env: Mapping[str, str]) -> dict[str, str]:
    """``env`` (the command's whole environment) with its Python processes recording their modules at exit, one
    ``record.<pid>`` each (and the stacks that first imported a :data:`HEAVY` package into ``record.stacks``): the
    recorder goes first on ``env``'s PYTHONPATH, which is kept."""
    path = os.pathsep.join(filter(None, [str(RECORDER), env.get("PYTHONPATH", "")]))
    return {**env, "PYTHONPATH": path, "PGLOGICAL_IMPORTED_MODULES": str(record),
            "PGLOGICAL_WATCHED_IMPORTS": ",".join(HEAVY)}


def recorded_modules(record: Path) -> set[str]:
    """The modules any process of the command recorded (the union of the ``record.<pid>`` files); fails unless the
    command's own process (``record.root`` names it) recorded a list, so an empty union cannot pass unnoticed."""
    root = record.with_name(record.name + ".root")
    assert root.exists(), f"no process recorded its modules into {record}.*"
    own = record.with_name(f"{record.name}.{root.read_text().strip()}")
    assert own.exists() and own.read_text().split(), f"the command's process recorded no modules in {own}"
    files = [p for p in record.parent.glob(record.name + ".*") if p.suffix[1:].isdigit()]
    return {module for p in files for module in p.read_text().split()}


def heavy_imports(record: Path) -> list[str]:
    """The :data:`HEAVY` packages among the modules the command's processes recorded (:func:`recorded_modules`),
    each with the stack that imported it first when one was recorded (what to make lazy)."""
    heavy = sorted({m.split(".")[0] for m in recorded_modules(record) if m.split(".")[0] in HEAVY})
    stacks = record.with_name(record.name + ".stacks")
    if heavy and stacks.exists():
        print(stacks.read_text())  # pytest shows it with the failure
    return heavy
