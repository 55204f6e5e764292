"""`make test-dist`: the built wheels installed as users install them, in fresh venvs, and run.

``make dist`` first builds ``dist/`` from a clean copy of HEAD. Then, per CPython (3.11, 3.12, 3.13, or
``DIST_PYTHONS``): a fresh venv gets that Python's manylinux wheel (a file, not an editable install) with its
runtime dependencies only (``--prefer-binary``; no ``constraints.txt``, which is the dev lock), and:

* ``pip check``; no full ``pyspark`` installed; the package, the CLI, the operators and the DAG factory import
  with ``pyspark`` blocked (a worker that only submits to a cluster needs no Spark);
* ``airflow providers list`` shows the provider, ``pglogical --version`` prints the wheel's version, and the
  compiled helpers are in use with the binary COPY fetch;
* then the ``[spark]`` extra, and ``pglogical run`` against a real PostgreSQL (``scripts/harness/pgserver.py``) with the
  compiled helpers and again with ``PGLOGICAL_PURE_PYTHON=1``, the target compared with the source;
* in the first venv, the ``py3-none-any`` wheel replaces the compiled one: the pure-Python paths run too.

``DIST_AIRFLOW=3.2.2`` pins Airflow in every venv (to try another version of the range). Prints each step's
time; pip's cache is the user's usual one.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import psycopg2
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.dist import default_pythons  # noqa: E402
from scripts.harness.pgserver import PgServer, start_server, stop_server  # noqa: E402
from scripts.harness.userenv import run_as_user  # noqa: E402

# Imports a worker without Spark makes, with pyspark (the Spark provider's pyspark-client included) blocked.
NO_SPARK_IMPORTS = """
import importlib, sys
class NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "py4j"):
            raise ImportError(f"{name} is blocked")
sys.meta_path.insert(0, NoSpark())
for module in ("airflow_provider_pglogical", "airflow_provider_pglogical.cli", "airflow_provider_pglogical.operators",
               "airflow_provider_pglogical.sensors", "airflow_provider_pglogical.pipeline.dag_factory"):
    importlib.import_module(module)
from airflow_provider_pglogical import get_provider_info
from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.hooks import copystream
print(get_provider_info()["package-name"], speedups.implementation(), copystream.available())
"""
FULL_PYSPARK = "import importlib.metadata as m\ntry:\n    m.distribution('pyspark'); print('pyspark')\nexcept m.PackageNotFoundError:\n    print('none')"


class Failed(Exception):
    pass


def run(args: list[str], extra: dict[str, str] | None = None, timeout: float = 1800) -> str:
    started = time.monotonic()
    done = run_as_user(args, {"PIP_CACHE_DIR": str(Path.home() / ".cache" / "pip"), **(extra or {})},
                       timeout=timeout)
    shown = " ".join(Path(a).name if a.startswith("/") else a.strip().splitlines()[0] for a in args)
    print(f"  {time.monotonic() - started:6.1f}s  {shown[:110]}", flush=True)
    if done.returncode != 0:
        raise Failed(f"{' '.join(args[:4])} ... exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done.stdout


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)


def execute(dsn: str, statements: str) -> list[tuple[object, ...]]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(statements)
        rows = cur.fetchall() if cur.description else []
    conn.close()
    return rows


def end_to_end(server: PgServer, venv: Path, work: Path, label: str, extra: dict[str, str]) -> None:
    """A fresh source and target database, a spec, changes, ``pglogical run`` twice; the target equals the source."""
    source, target = f"src_{label}", f"dst_{label}"
    for db in (source, target):
        conn = psycopg2.connect(server.dsn())
        conn.autocommit = True
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
        conn.cursor().execute(f"CREATE DATABASE {db}")
        conn.close()
    execute(server.dsn(source), "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2))")
    spec = work / f"{label}.yaml"
    spec.write_text(yaml.safe_dump({
        "source": {"dsn": server.uri(source), "publication": "dist_pub", "slot": f"dist_{label}", "create": True},
        "staging": {"uri": str(work / f"staging-{label}")},
        "target": {"kind": "postgres", "dsn": server.uri(target)},
        "tables": {"public.items": {}},
        "spark": {"master": "local[2]"},
    }))
    pglogical = str(venv / "bin" / "pglogical")
    run([pglogical, "run", "--spec", str(spec)], extra)  # creates slot and publication, snapshots the empty table
    execute(server.dsn(source), "INSERT INTO items SELECT g, 'item ' || g, g * 1.25 FROM generate_series(1, 500) g; "
                                "UPDATE items SET price = price * 2 WHERE id % 7 = 0; DELETE FROM items WHERE id % 11 = 0")
    run([pglogical, "run", "--spec", str(spec)], extra)
    query = "SELECT id, name, price FROM items ORDER BY id"
    want, got = execute(server.dsn(source), query), execute(server.dsn(target), query)
    expect(len(want) > 400 and got == want, f"{label}: target has {len(got)} rows, source {len(want)}, or they differ")


def check_venv(python: str, wheels: list[Path], server: PgServer, work: Path, version: str, first: bool) -> float:
    started = time.monotonic()
    out = run([python, "-c", "import sys; print(f'{sys.version_info[0]}{sys.version_info[1]}')"]).strip()
    (wheel,) = [w for w in wheels if f"-cp{out}-cp{out}-manylinux" in w.name]
    pure = next(w for w in wheels if w.name.endswith("-py3-none-any.whl"))
    print(f"Python {out[0]}.{out[1:]}: {wheel.name}", flush=True)
    venv = work / f"venv{out}"
    run([python, "-m", "venv", str(venv)])
    py, bin_ = str(venv / "bin" / "python"), venv / "bin"
    airflow_pin = [f"apache-airflow=={os.environ['DIST_AIRFLOW']}"] if os.environ.get("DIST_AIRFLOW") else []
    run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    run([py, "-m", "pip", "install", "-q", "--prefer-binary", str(wheel), *airflow_pin])
    run([py, "-m", "pip", "check"])
    expect(run([py, "-c", FULL_PYSPARK]).strip() == "none", "pyspark is installed without the [spark] extra")
    imported = run([py, "-c", NO_SPARK_IMPORTS]).split()
    expect(imported == ["airflow-provider-pglogical", "compiled", "True"], f"imports without Spark: {imported}")
    home = {"AIRFLOW_HOME": str(work / f"airflow{out}")}
    providers = run([str(bin_ / "airflow"), "providers", "list", "--output", "plain"], home)
    expect("airflow-provider-pglogical" in providers, f"`airflow providers list` lacks the provider:\n{providers}")
    expect(run([str(bin_ / "pglogical"), "--version"]).split()[-1] == version, "pglogical --version")
    run([py, "-m", "pip", "install", "-q", "--prefer-binary", f"{wheel}[spark]", *airflow_pin])
    end_to_end(server, venv, work, f"c{out}", {})
    end_to_end(server, venv, work, f"p{out}", {"PGLOGICAL_PURE_PYTHON": "1"})
    if first:  # the pure-Python wheel, where no binary wheel fits
        run([py, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(pure)])
        imported = run([py, "-c", NO_SPARK_IMPORTS]).split()
        expect(imported == ["airflow-provider-pglogical", "python", "False"], f"pure wheel: {imported}")
        end_to_end(server, venv, work, f"w{out}", {})
    seconds = time.monotonic() - started
    print(f"Python {out[0]}.{out[1:]}: passed in {seconds:.0f}s", flush=True)
    return seconds


def main() -> int:
    started = time.monotonic()
    dist = ROOT / "dist"
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    if not wheels or not sdists:
        print("test-dist: dist/ is empty; run `make dist` first", file=sys.stderr)
        return 2
    version = re.sub(r"\.tar\.gz$", "", sdists[0].name).rpartition("-")[2]
    pythons = os.environ.get("DIST_PYTHONS", "").split() or default_pythons()
    server = start_server()
    try:
        with tempfile.TemporaryDirectory(prefix="pglogical-test-dist-") as tmp:
            for i, python in enumerate(pythons):
                check_venv(python, wheels, server, Path(tmp), version, first=i == 0)
    except Failed as exc:
        print(f"test-dist: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_server(server)
    print(f"test-dist: {len(pythons)} Pythons passed in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
