"""The ``pglogical`` command line: validate, decode, apply, run, status, prune, check, report, reset, drop (and
maintain for Delta) of a pipeline spec."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from airflow_provider_pglogical import __version__
from airflow_provider_pglogical.exceptions import PgLogicalError
from airflow_provider_pglogical.hooks.storage_connection import staging_connection
from airflow_provider_pglogical.pipeline.spec import PipelineSpec, load_spec

EXIT_OK = 0
EXIT_FAILED = 1  # a PgLogicalError or an unexpected error; argparse uses 2 for usage errors
EXIT_CANNOT_RUN = 3  # status: the JSON is printed, and its "problems" say why the pipeline cannot run
EXIT_AT_RISK = 4  # check: the slot can still be saved (drain it, raise max_slot_wal_keep_size): act now
EXIT_LOST = 5  # check: the slot is invalidated or gone: the target needs a resync


def progress(message: str) -> None:
    """Progress goes to stderr so stdout stays machine-readable JSON."""
    print(f"pglogical: {message}", file=sys.stderr, flush=True)


def cmd_validate(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    if args.source:
        from airflow_provider_pglogical.pipeline.source import check_column_lists, source_client

        progress("checking the column lists and row filters against the source catalog")
        with source_client(spec) as client:
            check_column_lists(spec, client)
    if args.filters:
        from airflow_provider_pglogical.pipeline.runs import local_spark
        from airflow_provider_pglogical.pipeline.validation import check_row_filters

        progress("parsing row filters with Spark")
        with local_spark(args.master or spec.spark.where) as spark:
            check_row_filters(spec, spark)
    if spec.targets:
        from airflow_provider_pglogical.pipeline.target import target_kinds

        kinds = target_kinds(spec)
        return {"spec": spec.origin, "valid": True, "tables": sorted(spec.tables),
                "targets": {name: {"kind": kinds[name], "tables": sorted(t.tables)} for name, t in spec.targets.items()}}
    return {"spec": spec.origin, "valid": True, "tables": sorted(spec.tables)}


def cmd_decode(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.runs import decode_pending

    return decode_pending(spec, max_batches=args.max_batches, log=progress, allow_gap=args.allow_gap)


def cmd_apply(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.retention import check_window, prune
    from airflow_provider_pglogical.pipeline.runs import apply_pending

    if spec.targets:
        from airflow_provider_pglogical.pipeline.fanout import apply_targets

        applied = apply_targets(spec, args.target, master=args.master, log=progress)
        return _fanned_out({"targets": applied.summary(), "retention": prune(spec, log=progress)}, applied.failures)
    _default_target(spec, args)
    check_window(spec)  # a target that would need pruned batches fails before anything is applied
    result = apply_pending(spec, master=args.master, log=progress)
    return {**result, "retention": prune(spec, log=progress)}


def cmd_run(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.retention import check_window, prune
    from airflow_provider_pglogical.pipeline.runs import run_pending

    if spec.targets:
        from airflow_provider_pglogical.pipeline.fanout import run_targets

        result, applied = run_targets(spec, args.target, master=args.master, max_batches=args.max_batches,
                                      log=progress, allow_gap=args.allow_gap)
        return _fanned_out({**result, "targets": applied.summary(), "retention": prune(spec, log=progress)},
                           applied.failures)
    _default_target(spec, args)
    check_window(spec)
    result = run_pending(spec, master=args.master, max_batches=args.max_batches, log=progress,
                         allow_gap=args.allow_gap)
    return {**result, "retention": prune(spec, log=progress)}


class TargetsFailed(Exception):  # noqa: N818 - not an error of its own: carries the JSON and the per-target errors
    """Some targets of the command failed (the others' results are in ``result``): the JSON is printed, then one line
    per failed target, and the command exits non-zero."""

    def __init__(self, result: dict[str, Any], failures: dict[str, BaseException]) -> None:
        super().__init__(f"{len(failures)} target(s) failed: {', '.join(failures)}")
        self.result = result
        self.failures = failures


def _fanned_out(result: dict[str, Any], failures: dict[str, BaseException]) -> dict[str, Any]:
    if failures:
        raise TargetsFailed(result, failures)
    return result


def _default_target(spec: PipelineSpec, args: argparse.Namespace) -> None:
    """``--target`` with a ``target:`` spec: only its one target's name (``default``) is known."""
    from airflow_provider_pglogical.pipeline.fanout import select_views

    select_views(spec, getattr(args, "target", None))


def cmd_prune(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.retention import prune

    return prune(spec, dry_run=args.dry_run, log=progress, require_settings=True)


def cmd_resync(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.snapshots import sync_tables
    from airflow_provider_pglogical.pipeline.source import resolved

    spec = resolved(spec)  # tables selected by "*" / schema.* can be resynced by name
    unknown = sorted(set(args.table) - set(spec.tables))
    if unknown:
        from airflow_provider_pglogical.exceptions import SpecError

        raise SpecError(f"--table {', '.join(unknown)}: not in the spec's tables")
    return sync_tables(spec, resync=list(dict.fromkeys(args.table)), log=progress)


def cmd_reset(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.fanout import select_views
    from airflow_provider_pglogical.pipeline.runs import reset_target

    if spec.targets and not args.target:
        from airflow_provider_pglogical.exceptions import SpecError

        raise SpecError(f"{spec.origin}: reset empties one target's tables; name it with --target "
                        f"({', '.join(spec.target_names)})")
    views = select_views(spec, args.target)
    if not spec.targets:
        return reset_target(spec, log=progress)
    return {"targets": {name: reset_target(view, log=progress) for name, view in views.items()}}


def cmd_drop(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.exceptions import ConfirmationRequiredError, SpecError
    from airflow_provider_pglogical.pipeline.runs import drop_pipeline

    if args.target is not None:
        from airflow_provider_pglogical.pipeline.teardown import retire_target

        if args.staging:  # the staging area feeds the other targets
            raise SpecError("--staging removes the staging area every target applies from; drop --target retires "
                            "one target and keeps it")
        if not args.yes and not args.dry_run:
            raise ConfirmationRequiredError(
                f"drop --target {args.target} forgets that target's bookkeeping and its staging records for good "
                "(its tables stay); confirm with --yes (--dry-run lists what would be dropped)")
        return retire_target(spec, args.target, dry_run=args.dry_run, log=progress)
    if not args.yes and not args.dry_run:
        raise ConfirmationRequiredError(
            f"drop removes slot {spec.source.slot!r} and the changes it holds for good; confirm with --yes "
            "(--dry-run lists what would be dropped)")
    return drop_pipeline(spec, dry_run=args.dry_run, staging=args.staging, log=progress)


def cmd_status(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.source import resolved
    from airflow_provider_pglogical.pipeline.status import status

    return status(resolved(spec), batches=args.batches)  # each target's view is resolved on its own there


def cmd_check(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.hooks.sizes import parse_size
    from airflow_provider_pglogical.pipeline.monitoring import check, thresholds

    def size(value: str | None, option: str) -> int | None:
        if value is None:
            return None
        try:
            return parse_size(value)
        except ValueError as exc:
            from airflow_provider_pglogical.exceptions import SpecError

            raise SpecError(f"{option} {value!r}: {exc}") from None

    limits = thresholds(spec, min_safe_wal_bytes=size(args.min_safe_wal_size, "--min-safe-wal-size"),
                        max_lag_bytes=size(args.max_lag, "--max-lag"))
    result = check(spec, limits)
    for finding in result["findings"]:
        progress(finding["message"])
    return result


def cmd_report(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.exceptions import SpecError
    from airflow_provider_pglogical.history.record import parse_since
    from airflow_provider_pglogical.pipeline.monitoring import report

    try:
        since = parse_since(args.since) if args.since else None
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    data, page = report(spec, since=since)
    if args.html:
        with open(args.html, "w", encoding="utf-8") as out:
            out.write(page)
        progress(f"wrote {args.html} ({len(data['runs'])} run(s))")
    if args.json or not args.html:
        return data
    return {"html": os.path.abspath(args.html), "runs": len(data["runs"]), "current": data["current"]}


def cmd_maintain(spec: PipelineSpec, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_provider_pglogical.pipeline.fanout import select_views
    from airflow_provider_pglogical.pipeline.source import resolved
    from airflow_provider_pglogical.pipeline.target import spec_target

    views = select_views(spec, args.target)
    if not spec.targets:
        return spec_target(resolved(spec)).maintain(retention_hours=args.retention_hours, vacuum=not args.no_vacuum)
    # Without --target: the targets maintain applies to (a named one that is not is refused by its handle).
    handles = {name: spec_target(resolved(view)) for name, view in views.items()}
    return {"targets": {name: t.maintain(retention_hours=args.retention_hours, vacuum=not args.no_vacuum)
                        for name, t in handles.items() if args.target or t.maintainable}}


COMMANDS: dict[str, tuple[Callable[[PipelineSpec, argparse.Namespace], dict[str, Any]], str]] = {
    "validate": (cmd_validate, "check a spec (with --filters also parse row filters with Spark)"),
    "decode": (cmd_decode, "ensure publication/slot, check WAL retention, drain the slot into staging"),
    "apply": (cmd_apply, "apply every staged batch past the target's watermarks with Spark"),
    "run": (cmd_run, "decode, then apply everything pending (Spark starts while the drain runs, when it has changes)"),
    "resync": (cmd_resync, "snapshot tables again at a later LSN; apply replaces them, then applies later changes"),
    "reset": (cmd_reset, "empty the target tables and forget the slot's watermarks: the next apply applies the "
                         "staged log (and snapshots) again from its start"),
    "drop": (cmd_drop, "tear the pipeline down: drop its slot (releasing the WAL it pins), the publication it "
                       "created and the slot's bookkeeping on the target (not the target tables); --staging also "
                       "removes its staging area; --target NAME retires one target only"),
    "prune": (cmd_prune, "remove the staged batches every target of the staging area has applied, as "
                         "staging.retention allows (also done after every run and apply)"),
    "status": (cmd_status, "slot position and lag, a summary of the staging area, target watermarks (JSON); "
                           "--batches also lists every staged batch; exit code 3 when the pipeline cannot run "
                           "(its \"problems\" say why)"),
    "check": (cmd_check, "slot health before max_slot_wal_keep_size invalidates it (JSON); exit code 4 while "
                         "there is still time to act, 5 once the slot is lost or gone"),
    "report": (cmd_report, "the run history: --html FILE writes a self-contained page of plots, --json prints it"),
    "maintain": (cmd_maintain, "Delta and Iceberg targets: compact small files, vacuum unreferenced ones (Delta) or "
                               "expire old snapshots (Iceberg)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pglogical", description="Drain a pgoutput slot into LSN-keyed Parquet "
                                     "and apply it to a target, driven by a pipeline spec.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"pglogical {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_func, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--spec", required=True, metavar="FILE", help="pipeline spec (YAML or JSON)")
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")
        if name in ("apply", "run", "validate"):
            p.add_argument("--master", metavar="URL", help="Spark master, or sc://host:port for a Spark Connect server (default: spec spark.remote or spark.master, else local[*])")
        if name in ("apply", "run", "reset", "maintain"):
            p.add_argument("--target", action="append", metavar="NAME",
                           help="only this target of the spec's targets: (repeatable; default: every one)"
                           if name != "reset" else "the target of the spec's targets: to reset (repeatable)")
        if name in ("decode", "run"):
            p.add_argument("--max-batches", type=int, metavar="N", help="stop after N batches (default: drain all)")
            p.add_argument("--allow-gap", action="store_true",
                           help="a slot recreated past the staged log's end drains on; the changes in between are lost")
        if name == "check":
            p.add_argument("--min-safe-wal-size", metavar="SIZE",
                           help="at risk when safe_wal_size is below SIZE, e.g. 1GB (default: source.min_safe_wal_bytes)")
            p.add_argument("--max-lag", metavar="SIZE",
                           help="at risk when the slot lags more than SIZE, e.g. 10GB (default: source.max_lag_bytes)")
        if name == "report":
            p.add_argument("--html", metavar="FILE", help="write the report as one self-contained HTML page")
            p.add_argument("--json", action="store_true", help="print the report's data (the default without --html)")
            p.add_argument("--since", metavar="WHEN", help="runs ending at or after an ISO time or an age (24h, 7d)")
        if name == "maintain":
            p.add_argument("--retention-hours", type=int, default=168, metavar="H",
                           help="VACUUM keeps files referenced by snapshots younger than H hours (default 168)")
            p.add_argument("--no-vacuum", action="store_true", help="only compact and checkpoint")
        if name == "resync":
            p.add_argument("--table", action="append", required=True, metavar="SCHEMA.TABLE",
                           help="table to resync (repeatable)")
        if name == "reset":
            p.add_argument("--yes", action="store_true", required=True, help="confirm emptying the target tables")
        if name == "drop":
            p.add_argument("--yes", action="store_true", help="confirm dropping the slot and the bookkeeping")
            p.add_argument("--dry-run", action="store_true", help="list what would be dropped (JSON), drop nothing")
            p.add_argument("--staging", action="store_true",
                           help="also remove the slot's staging area (batches, snapshots, records)")
            p.add_argument("--target", metavar="NAME",
                           help="retire only this target: its bookkeeping and its staging records go, the slot, "
                                "publication, staging and other targets stay (NAME: one of the spec's targets:, or "
                                "a recorded target that status and prune list)")
        if name == "prune":
            p.add_argument("--dry-run", action="store_true", help="report what would be pruned, remove nothing")
        if name == "status":
            p.add_argument("--batches", action="store_true", help="also list every staged batch with its counts")
        if name == "validate":
            p.add_argument("--filters", action="store_true", help="also parse row filters (starts Spark)")
            p.add_argument("--source", action="store_true", help="also check column lists against the source catalog")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    func = COMMANDS[args.command][0]
    if not args.debug:
        from airflow_provider_pglogical.pipeline.runs import silence_spark_logs

        silence_spark_logs()
    try:
        with stdout_to_stderr():
            spec = load_spec(args.spec)
            with staging_connection(spec.staging.uri, spec.staging.conn_id):
                result = func(spec, args)
    except KeyboardInterrupt:
        print("pglogical: interrupted", file=sys.stderr)
        return 130
    except TargetsFailed as failed:
        # The targets that applied did (their results are in the JSON); each failed one gets its line.
        _print_json(failed.result)
        for name, exc in failed.failures.items():
            print(f"pglogical {args.command}: error: target {name}: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        if args.debug:
            raise
        print(f"pglogical {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    _print_json(result)
    if not args.debug:
        from airflow_provider_pglogical.pipeline.runs import discard_spark_logs

        discard_spark_logs()
    return exit_code(args.command, result)


def _print_json(result: dict[str, Any]) -> None:
    json.dump(result, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")
    sys.stdout.flush()
    os.dup2(2, 1)  # exit-time log lines (py4j shutdown) must not follow the JSON


def exit_code(command: str, result: dict[str, Any]) -> int:
    """0, or the documented code of a ``status`` that cannot run or a ``check`` that found the slot at risk or lost."""
    if command == "status" and result.get("problems"):
        return EXIT_CANNOT_RUN
    if command == "check":
        return {"at_risk": EXIT_AT_RISK, "lost": EXIT_LOST}.get(str(result.get("health")), EXIT_OK)
    return EXIT_OK


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout meanwhile to stderr, at the file-descriptor level.

    Airflow's logging (imported with a conn_id source or target), py4j and the Spark JVM write to
    fd 1; stdout must carry nothing but the command's JSON.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def one_line(exc: BaseException) -> str:
    """Our errors carry a user-facing message; anything else also names its type. A Spark data exception
    (SQLSTATE class 22: a row filter's cast failing on a staged value, say) is named by its condition alone,
    since Spark's message quotes the value."""
    state = _spark_sql_state(exc)
    if state is not None and state.startswith("22"):
        condition = exc.getCondition() if hasattr(exc, "getCondition") else "data exception"
        return (f"{type(exc).__name__}: [{condition}] SQLSTATE {state} while the apply evaluated a staged value (a row "
                "filter's cast, say); Spark's message is not shown, as it quotes row values")
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, PgLogicalError) else f"{type(exc).__name__}: {text}"


def _spark_sql_state(exc: BaseException) -> str | None:
    """The SQLSTATE of a PySpark error (``PySparkException.getSqlState``), without importing pyspark."""
    get = getattr(exc, "getSqlState", None)
    try:
        state = get() if callable(get) else None
    except Exception:  # noqa: BLE001 - a message is still printed without it
        return None
    return state if isinstance(state, str) else None


if __name__ == "__main__":
    sys.exit(main())
