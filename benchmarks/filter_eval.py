"""Benchmark: a row filter over staged-like images, per row (``filter_eval``, the reference) and over whole columns
(``filter_columns``), side by side in one run, answers compared.

``python benchmarks/filter_eval.py --rows 1875000 --filter "a % 2 = 0"``: images of the filtered workload's table
(``a int`` as ``g % 1000``, ``b text`` md5-like, a tenth of the images null); prints one JSON object with the seconds
of each (best of ``--repeat``) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

from airflow_provider_pglogical.apply import filter_columns  # noqa: E402


def images(rows: int) -> pa.StructArray:
    g = np.arange(rows, dtype=np.int64)
    a = pa.array((g % 1000).astype(np.int32))
    b = pa.array([format(i * 2654435761 % 2**32, "08x") for i in range(rows)], pa.string())
    return pa.StructArray.from_arrays([a, b], names=["a", "b"], mask=pa.array(g % 10 == 9))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_875_000)
    p.add_argument("--filter", default="a % 2 = 0")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    image = images(args.rows)
    matcher = filter_columns.compile_matcher(args.filter, {"a": pa.int32(), "b": pa.string()})
    if matcher.columnar is None:
        print(f"{args.filter!r} is evaluated per row only", file=sys.stderr)
        return 1
    seconds: dict[str, list[float]] = {"per_row": [], "columns": []}
    answers = {}
    for _ in range(args.repeat):
        for name, run in (("per_row", lambda: matcher.reference.matches(image)), ("columns",
                                                                                 lambda: matcher.matches(image))):
            t0 = time.perf_counter()
            answers[name] = run()
            seconds[name].append(round(time.perf_counter() - t0, 3))
    same = bool(np.array_equal(answers["per_row"], answers["columns"]))
    print(json.dumps({"rows": args.rows, "filter": args.filter, "per_row_s": seconds["per_row"],
                      "columns_s": seconds["columns"],
                      "ratio_columns_over_per_row": round(min(seconds["columns"]) / min(seconds["per_row"]), 3),
                      "same_answers": same, "load_average": [round(x, 2) for x in os.getloadavg()]}, indent=2))
    return 0 if same else 1  # different answers: the timing means nothing


if __name__ == "__main__":
    sys.exit(main())
