"""Snapshot reader process: ``python -m airflow_provider_pglogical.snapshot.worker``.

Reads one JSON ``ChunkTask`` per stdin line, copies it (``copier.copy_chunk``), answers one JSON
line on stdout: ``{"ok": ChunkResult}`` or ``{"error": type, "message": text}``. A fresh
interpreter importing only the copier: no fork of a process holding the replication connection
(or Spark/JVM threads), and no re-import of the caller's ``__main__`` as ``spawn`` would do.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any


def main() -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # only answers go to the parent's pipe: what the imports print must not reach it
    try:
        from airflow_provider_pglogical.snapshot.copier import ChunkTask, copy_chunk, warm

        warm()  # while the parent creates the slot: the first chunk starts reading at once
        failed: dict[str, Any] | None = None
    except Exception as exc:  # noqa: BLE001 - the first task's answer: the parent raises it typed
        failed = {"error": "SnapshotError",
                  "message": f"a snapshot reader process could not import what it reads with "
                             f"({type(exc).__name__}: {exc}); nothing was read"}
    for line in sys.stdin:
        if not line.strip():
            continue
        if failed is not None:
            out.write(json.dumps(failed) + "\n")
            out.flush()
            return 1
        try:
            result = copy_chunk(ChunkTask(**json.loads(line)))
            answer: dict[str, Any] = {"ok": dataclasses.asdict(result)}
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it typed
            answer = {"error": type(exc).__name__, "message": str(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
