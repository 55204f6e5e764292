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
* in the first venv, the ``[spark]`` install is the getting-started page's (``docs/getting-started.md``): its
  fenced blocks are parsed from the page and run as written — shell lines, the SQL, the spec, the DAG — with only
  the substitutions listed in ``PAGE_RULES``; the target must equal the source after the page's ``run``;
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg2
import psycopg2.sql
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.dist import default_pythons  # noqa: E402
from scripts.harness.pgserver import PgServer, start_server, stop_server  # noqa: E402
from scripts.harness.userenv import run_as_user  # noqa: E402

# Imports a worker without Spark makes, with pyspark (the Spark provider's pyspark-client included) blocked; the
# metadata test runs the same imports in the dev venv.
WITHOUT_SPARK = """
import importlib, sys
class NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("pyspark", "py4j"):
            raise ImportError(f"{name} is blocked")
sys.meta_path.insert(0, NoSpark())
for module in ("airflow_provider_pglogical", "airflow_provider_pglogical.cli", "airflow_provider_pglogical.operators",
               "airflow_provider_pglogical.sensors", "airflow_provider_pglogical.pipeline.dag_factory"):
    importlib.import_module(module)
"""
NO_SPARK_IMPORTS = WITHOUT_SPARK + """
from airflow_provider_pglogical import get_provider_info
from airflow_provider_pglogical.decoding import speedups
from airflow_provider_pglogical.hooks import copystream
print(get_provider_info()["package-name"], speedups.implementation(), copystream.available())
"""
FULL_PYSPARK = "import importlib.metadata as m\ntry:\n    m.distribution('pyspark'); print('pyspark')\nexcept m.PackageNotFoundError:\n    print('none')"


class Failed(Exception):
    pass


def run(args: list[str], extra: dict[str, str] | None = None, timeout: float = 1800,
        cwd: Path | None = None) -> str:
    started = time.monotonic()
    done = run_as_user(args, {"PIP_CACHE_DIR": str(Path.home() / ".cache" / "pip"), **(extra or {})},
                       timeout=timeout, cwd=cwd)
    # Absolute paths shown by their last part, also inside a shell line.
    shown = " ".join(re.sub(r"(?<![\w.])/[^\s\"']*/", "", a.strip().splitlines()[0]) for a in args)
    print(f"  {time.monotonic() - started:6.1f}s  {shown[:110]}", flush=True)
    if done.returncode != 0:
        raise Failed(f"{' '.join(args[:4])} ... exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return done.stdout


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Failed(what)


def execute(dsn: str, statements: str | psycopg2.sql.Composable) -> list[tuple[object, ...]]:
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute(statements)
        rows = cur.fetchall() if cur.description else []
    conn.close()
    return rows


def create_databases(server: PgServer, *names: str) -> None:
    for db in names:
        conn = psycopg2.connect(server.dsn())
        conn.autocommit = True
        conn.cursor().execute(f"DROP DATABASE IF EXISTS {db}")
        conn.cursor().execute(f"CREATE DATABASE {db}")
        conn.close()


def end_to_end(server: PgServer, venv: Path, work: Path, label: str, extra: dict[str, str]) -> None:
    """A fresh source and target database, a spec, changes, ``pglogical run`` twice; the target equals the source."""
    source, target = f"src_{label}", f"dst_{label}"
    create_databases(server, source, target)
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


GETTING_STARTED = ROOT / "docs" / "getting-started.md"
FENCE = re.compile(r"^```(\w*)\s*$")
# The page's fenced blocks, per language in page order, and what each one is to the test. A block more or less
# fails: a new block needs a place here (and a rule below if it cannot run as written).
PAGE_LAYOUT = {"bash": ("install", "run"), "sql": ("source table",), "yaml": ("spec", "airflow spec"),
               "python": ("dag",)}

# PAGE_RULES: every way the test departs from the page as written, in one place. A rule whose text is no longer on
# the page fails (the page changed: the rule must follow it).
# * Lines not run, with the reason:
SKIPPED_LINES = {
    "python -m venv .venv": "the venv under test is already made, by the CPython under test",
}
# * Text replaced in a block (see page_text_rules): the PyPI requirement by the built wheel with the same extra;
#   `.venv/bin/` by the test venv's bin; the DAG's spec path by the spec in a temp dags folder.
# * Spec keys replaced (the `spec` block is parsed, every other key stays as written): the DSNs by the test
#   server's databases, the staging path by a temp dir. The `airflow spec` block replaces each section's `dsn`
#   as the page says (its keys in place of the `dsn`), over the same test spec.
PAGE_SPEC_KEYS = (("source", "dsn"), ("target", "dsn"), ("staging", "uri"))
# * Added: rows in the page's table before its `run` (a table with data, which the first run must copy), and
#   changes before the `run` block runs a second time (what the schedule picks up).
PAGE_ROWS = "INSERT INTO items SELECT g, 'item ' || g, g * 1.25 FROM generate_series(1, 300) g"
PAGE_CHANGES = ("INSERT INTO items SELECT g, 'item ' || g, g * 1.25 FROM generate_series(301, 400) g; "
                "UPDATE items SET price = price * 2 WHERE id % 7 = 0; DELETE FROM items WHERE id % 11 = 0")
# * The DAG file is loaded in the venv (no Airflow connection defined: loading it must contact nothing).
LOAD_DAG = """
import runpy, sys
found = [v for v in runpy.run_path(sys.argv[1]).values() if hasattr(v, "dag_id") and hasattr(v, "task_ids")]
print(" ".join(f"{dag.dag_id}:{len(dag.task_ids)}" for dag in found))
"""


def page_text_rules(venv: Path, wheel: Path, dag_spec: Path) -> dict[str, list[tuple[str, str]]]:
    """Per page block, the (page text, replacement) pairs of PAGE_RULES."""
    return {"install": [('"airflow-provider-pglogical[spark]"', f'"{wheel}[spark]"'), (".venv/bin/", f"{venv}/bin/")],
            "run": [(".venv/bin/", f"{venv}/bin/")],
            "dag": [("/opt/airflow/dags/pipeline.yaml", str(dag_spec))]}


@dataclass(frozen=True)
class Block:
    """One fenced block of the page: its language, the page line of its first line, its text."""

    lang: str
    line: int
    text: str

    @property
    def where(self) -> str:
        return f"{GETTING_STARTED.relative_to(ROOT)}:{self.line} ({self.lang} block)"

    def replaced(self, rules: list[tuple[str, str]]) -> Block:
        text = self.text
        for old, new in rules:
            expect(old in text, f"{self.where}: no `{old}` to replace; the page changed, update PAGE_RULES")
            text = text.replace(old, new)
        return Block(self.lang, self.line, text)


def page_blocks(page: Path) -> dict[str, Block]:
    """The page's fenced blocks by their PAGE_LAYOUT names."""
    found: dict[str, list[Block]] = {}
    lang: str | None = None
    body: list[str] = []
    start = 0
    for number, line in enumerate(page.read_text().splitlines(), 1):
        fence = FENCE.match(line)
        if fence and lang is None:
            lang, start, body = fence.group(1) or "text", number + 1, []
        elif fence and lang is not None:
            found.setdefault(lang, []).append(Block(lang, start, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
    expect(lang is None, f"{page.relative_to(ROOT)}:{start - 1}: a fence is not closed")
    for lang in found.keys() | PAGE_LAYOUT.keys():
        have, want = found.get(lang, []), PAGE_LAYOUT.get(lang, ())
        expect(len(have) == len(want), f"{page.relative_to(ROOT)} has {len(have)} {lang} blocks "
                                       f"({', '.join(b.where for b in have)}), the test follows {len(want)}: "
                                       "update PAGE_LAYOUT / PAGE_RULES")
    return {name: block for lang, names in PAGE_LAYOUT.items() for name, block in zip(names, found[lang], strict=True)}


def run_shell(block: Block, cwd: Path) -> None:
    """Each line of a shell block in bash (pipefail), from ``cwd``, as a user types it."""
    for number, line in enumerate(block.text.splitlines(), block.line):
        if not line.strip() or line.strip() in SKIPPED_LINES:
            continue
        try:
            run(["bash", "-o", "pipefail", "-c", line], cwd=cwd)
        except Failed as exc:
            raise Failed(f"{GETTING_STARTED.relative_to(ROOT)}:{number} ({block.lang} block) `{line.strip()}`: {exc}") \
                from exc


def page_spec(block: Block, replace: dict[tuple[str, str], str]) -> dict[str, Any]:
    """The page's spec with the PAGE_SPEC_KEYS replaced; every other key as written."""
    spec = yaml.safe_load(block.text)
    for (section, key), value in replace.items():
        expect(key in (spec.get(section) or {}), f"{block.where}: no {section}.{key} to replace; update PAGE_RULES")
        spec[section][key] = value
    return dict(spec)


def airflow_spec(block: Block, spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with each section of the page's Airflow block in place of that section's ``dsn``."""
    overlay = yaml.safe_load(block.text)
    merged = dict(spec)
    for section, keys in overlay.items():
        expect("dsn" in spec.get(section, {}), f"{block.where}: {section} has no dsn in the page's spec")
        merged[section] = {**{k: v for k, v in spec[section].items() if k != "dsn"}, **keys}
    return merged


def expect_copied(server: PgServer, source: str, target: str, tables: list[str], where: str) -> None:
    for table in tables:
        query = psycopg2.sql.SQL("SELECT * FROM {} ORDER BY 1").format(psycopg2.sql.Identifier(*table.split(".")))
        try:
            want, got = execute(server.dsn(source), query), execute(server.dsn(target), query)
        except psycopg2.Error as exc:
            raise Failed(f"after {where}: {table}: {str(exc).splitlines()[0]}") from exc
        expect(len(want) > 0 and got == want,
               f"after {where}: target {table} has {len(got)} rows, the source {len(want)}, or they differ")


def follow_page(server: PgServer, venv: Path, wheel: Path, work: Path) -> None:
    """docs/getting-started.md run as written in ``venv`` (PAGE_RULES' substitutions only), from its install
    (the ``[spark]`` extra) to its ``run``; the target equals the source; the DAG file loads."""
    blocks = page_blocks(GETTING_STARTED)
    shell_lines = {line.strip() for name in ("install", "run") for line in blocks[name].text.splitlines()}
    for line in SKIPPED_LINES.keys() - shell_lines:
        raise Failed(f"{GETTING_STARTED.relative_to(ROOT)}: no `{line}` to skip; the page changed, update PAGE_RULES")
    source, target = "page_source", "page_target"
    create_databases(server, source, target)
    cwd, dags = work / "user", work / "user" / "dags"
    dags.mkdir(parents=True)
    rules = page_text_rules(venv, wheel, dags / "pipeline.yaml")
    print(f"Following {GETTING_STARTED.relative_to(ROOT)}", flush=True)
    run_shell(blocks["install"].replaced(rules["install"]), cwd)
    execute(server.dsn(source), blocks["source table"].text)
    execute(server.dsn(source), PAGE_ROWS)
    spec = page_spec(blocks["spec"], dict(zip(PAGE_SPEC_KEYS, (server.uri(source), server.uri(target),
                                                               str(work / "staging")), strict=True)))
    (cwd / "pipeline.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    run_block = blocks["run"].replaced(rules["run"])
    run_shell(run_block, cwd)
    expect_copied(server, source, target, list(spec["tables"]), f"{run_block.where} with rows in the table")
    execute(server.dsn(source), PAGE_CHANGES)
    run_shell(run_block, cwd)
    expect_copied(server, source, target, list(spec["tables"]), f"{run_block.where} again, after changes")
    (dags / "pipeline.yaml").write_text(yaml.safe_dump(airflow_spec(blocks["airflow spec"], spec), sort_keys=False))
    dag = blocks["dag"].replaced(rules["dag"])
    dag_file = dags / "pipeline_dag.py"
    dag_file.write_text(dag.text + "\n")
    try:
        loaded = run([str(venv / "bin" / "python"), "-c", LOAD_DAG, str(dag_file)], cwd=cwd).split()
    except Failed as exc:
        raise Failed(f"{dag.where}: the DAG file does not load: {exc}") from exc
    expect(len(loaded) == 1 and not loaded[0].endswith(":0"), f"{dag.where}: the DAG file defines {loaded}")


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
    if first:  # the [spark] install is the getting-started page's, followed to its `run`
        follow_page(server, venv, wheel, work / f"page{out}")
    else:
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
