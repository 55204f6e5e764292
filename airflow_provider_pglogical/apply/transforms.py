"""Pure DataFrame steps from staged changes to one net change per key, chained with ``.transform``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from airflow_provider_pglogical.apply.batches import ABSENT
from airflow_provider_pglogical.apply.meta import META
from airflow_provider_pglogical.apply.sparkenv import quoted, quoted_all

Step = Callable[[DataFrame], DataFrame]

# Output columns of ``to_key_events`` / ``compact`` besides the table's own columns.
KIND = META + "kind"  # D, I, U in events; D, I, U, R (replace: deleted then re-inserted) after compaction
KEEP = META + "keep"  # columns whose value must come from the target (unchanged TOAST)
LSN = META + "lsn"
SEQ = META + "seq"  # struct(commit_lsn, tx_order, sub, lsn): total order of events (lsn only breaks exact duplicates)
FROM = META + "from"  # old key (struct) of a row that arrived by a key change: 'u' values live there
AWAY = META + "away"  # in events: the DELETE half of a key change (the row moved to another key)
# After compaction: the key's row was changed in the batch before a key change moved it away, so the target row
# there is no source for the moved row's unchanged-TOAST values (the batch then needs the ordered replay).
TOUCHED = META + "touched"


def _op_to_action(op: str) -> str:
    return {"I": "insert", "U": "update", "D": "delete"}[op]


def filter_actions(actions: Sequence[str]) -> Step:
    """Step: keep only changes whose *original* operation is published (publish = '...')."""
    ops = [op for op in "IUD" if _op_to_action(op) in actions]

    def step(df: DataFrame) -> DataFrame:
        return df if len(ops) == 3 else df.where(F.col(META + "op").isin(ops))

    return step


def resolve_toast_from_old(columns: Sequence[str], identity: Sequence[str]) -> Step:
    """Step: fill unchanged-TOAST ('u') new values from the old image where it has them.

    'u' means "same as before", so the old value is the new one: an old image of REPLICA
    IDENTITY FULL has every column, a key-only image its identity columns (pgoutput does the
    same before evaluating row filters). Columns filled are removed from the unchanged list;
    what remains must come from the target row.
    """

    def step(df: DataFrame) -> DataFrame:
        old, new, toast = F.col(META + "old"), F.col(META + "new"), F.col(META + "new_unchanged_toast")
        has_full_old = old.isNotNull() & ~F.coalesce(F.col(META + "old_key_only"), F.lit(False))
        has_old = old.isNotNull()
        ident = set(identity)

        def fillable(name: str) -> Column:
            return has_old if name in ident else has_full_old

        filled = F.struct(*[
            F.when(fillable(c) & F.array_contains(toast, c), old.getField(c)).otherwise(new.getField(c)).alias(c)
            for c in columns])
        remaining = F.filter(toast, lambda x: ~((x.isin(list(ident)) & has_old) | has_full_old))
        return (df.withColumn(META + "new", F.when(new.isNull(), new).otherwise(filled))
                .withColumn(META + "new_unchanged_toast", F.coalesce(remaining, F.array().cast("array<string>"))))

    return step


def no_unchanged_toast(df: DataFrame) -> DataFrame:
    """Step: ``resolve_toast_from_old`` for changes of which none lists an unchanged-TOAST column: there is nothing
    to fill, so the images stay as they are (no struct rebuilt) and only the list is made non-null, as it does."""
    toast = META + "new_unchanged_toast"
    return df.withColumn(toast, F.coalesce(F.col(toast), F.array().cast("array<string>")))


def project_columns(columns: Sequence[str]) -> Step:
    """Step: a publication column list — images keep only the listed columns (after filtering)."""

    def step(df: DataFrame) -> DataFrame:
        def proj(name: str) -> Column:
            c = F.col(META + name)
            return F.when(c.isNull(), F.lit(None)).otherwise(F.struct(*[c.getField(x).alias(x) for x in columns]))

        return (df.withColumn(META + "old", proj("old")).withColumn(META + "new", proj("new"))
                .withColumn(META + "new_unchanged_toast",
                            F.filter(META + "new_unchanged_toast", lambda x: x.isin(list(columns)))))

    return step


def _kept(df: DataFrame, schema: StructType | None = None) -> Column:
    """The columns an INSERT/UPDATE takes from the target rather than from its new image: unchanged TOAST,
    and for an UPDATE the columns its schema version lacks (``batches.ABSENT``: a native subscriber leaves
    them as they are; an INSERT leaves them NULL, which its image holds). ``schema``: ``df``'s, when the caller
    has it (each question about a Spark Connect frame's columns is a round trip to the server)."""
    toast = F.col(META + "new_unchanged_toast")
    if ABSENT not in (schema or df.schema).fieldNames():  # frames of one schema version (snapshots)
        return toast
    return F.when(F.col(META + "op") == "U", F.concat(toast, F.col(ABSENT))).otherwise(toast)


def to_key_events(key: Sequence[str], columns: Sequence[str]) -> Step:
    """Step: one event per (key, change), table columns at top level.

    A DELETE is keyed by its old image, an INSERT by its new one, an UPDATE by its old image
    when there is one. An UPDATE that changes the key becomes a DELETE of the old key (sub 0,
    ``_pgl_away``) and an INSERT of the new key (sub 1) at the same position; the INSERT remembers
    the old key in ``_pgl_from`` so unchanged-TOAST values (and columns the UPDATE's schema version
    lacks) can be taken from the target row still there.
    """

    def step(df: DataFrame) -> DataFrame:
        op, old, new = F.col(META + "op"), F.col(META + "old"), F.col(META + "new")
        # The old key's struct type (a NULL of it where no key moved), and the frame's columns: one schema.
        schema = df.schema
        old_type = schema[META + "old"].dataType
        assert isinstance(old_type, StructType)
        from_type = StructType([StructField(k, old_type[k].dataType) for k in key])
        key_changed = (op == "U") & old.isNotNull() & ~F.coalesce(
            F.struct(*[old.getField(k) for k in key]).eqNullSafe(F.struct(*[new.getField(k) for k in key])),
            F.lit(False))
        toast = _kept(df, schema)
        from_key = F.struct(*[old.getField(k).alias(k) for k in key])
        empty = F.array().cast("array<string>")
        is_delete = op == "D"

        def event(kind: Column, sub: Column, key_image: Column, with_values: Column, keep: Column, moved_from: Column,
                  away: bool) -> Column:
            cols = [key_image.getField(c).alias(c) if c in key
                    else F.when(with_values, new.getField(c)).alias(c) for c in columns]
            return F.struct(kind.alias(KIND), _seq(sub).alias(SEQ), F.col(META + "lsn").alias(LSN), keep.alias(KEEP),
                            moved_from.alias(FROM), F.lit(away).alias(AWAY), *cols)

        main = event(
            F.when(is_delete, "D").when(op == "I", "I").when(key_changed, "I").otherwise("U"),
            F.when(is_delete, 0).otherwise(1),
            F.when(is_delete, old).when((op == "I") | key_changed | old.isNull(), new).otherwise(old),
            ~is_delete, F.when(is_delete, empty).otherwise(toast),
            F.when(key_changed, from_key).otherwise(F.lit(None).cast(from_type)), False)
        moved_away = event(F.lit("D"), F.lit(0), old, F.lit(False), empty, F.lit(None).cast(from_type), True)
        # One scan: a key change yields two events, everything else one.
        exploded = df.select(F.explode(F.when(key_changed, F.array(moved_away, main)).otherwise(F.array(main))).alias("e"))
        return exploded.select("e.*")

    return step


def _seq(sub: Column) -> Column:
    return F.struct(F.col(META + "commit_lsn").alias("c"), F.col(META + "tx_order").alias("o"), sub.alias("s"),
                    F.col(META + "lsn").alias("l"))


def to_ordered_changes(key: Sequence[str], columns: Sequence[str]) -> Step:
    """Step: one row per change for the ordered (native, row-by-row) replay, table columns at top level.

    Unlike ``to_key_events`` a key change stays one UPDATE, so the replay moves the row with
    UPDATE like the native apply worker and unchanged-TOAST values travel with it along any
    chain of key changes. ``_pgl_from`` is the key the change is matched by (old image, else the
    new one; null for INSERT); ``_pgl_seq`` orders changes across all tables of the batch.
    """

    def step(df: DataFrame) -> DataFrame:
        op, old, new = F.col(META + "op"), F.col(META + "old"), F.col(META + "new")
        match = F.when(old.isNotNull(), old).otherwise(new)
        return df.select(
            op.alias(KIND), _seq(F.lit(0)).alias(SEQ), F.col(META + "lsn").alias(LSN),
            F.when(op == "D", F.array().cast("array<string>")).otherwise(_kept(df)).alias(KEEP),
            F.when(op != "I", F.struct(*[match.getField(k).alias(k) for k in key])).alias(FROM),
            *[new.getField(c).alias(c) for c in columns])

    return step


def void_before(position: tuple[int, int] | None) -> Step:
    """Step: drop changes at or before a TRUNCATE position (commit_lsn, tx_order) — they are void."""

    def step(df: DataFrame) -> DataFrame:
        if position is None:
            return df
        c, o = position
        seq = F.col(SEQ)
        return df.where((seq.c > c) | ((seq.c == c) & (seq.o > o)))

    return step


def compact(key: Sequence[str], columns: Sequence[str]) -> Step:
    """Step: the net change per key over the batch, one row per key.

    Kinds: ``D`` the row must not exist; ``R`` deleted then inserted again (replace); ``I``
    inserted (conflicts with an existing row are resolved by policy); ``U`` updated (only if
    the row exists). Each column takes its value from the last event after the last DELETE that
    knows it; columns no such event knows are listed in ``_pgl_keep`` (the target keeps its value,
    takes it from the row at ``_pgl_from`` when the row arrived by a key change, or — for I/R
    without either — the value exists nowhere); ``_pgl_touched`` flags keys whose row changed in
    the batch before a key change moved it away. Ties on (commit_lsn, tx_order)
    cannot occur within one key except for a key change's two halves, which ``sub`` orders; the
    change LSN makes even duplicated rows order deterministically.
    Deterministic, so re-running a batch yields the same rows.
    """
    values = [c for c in columns if c not in key]

    def step(df: DataFrame) -> DataFrame:
        seq, kind, keep = F.col(SEQ), F.col(KIND), F.col(KEEP)
        last_d = F.max(F.when(kind == "D", seq)).over(Window.partitionBy(*quoted_all(key)))
        marked = df.withColumn(META + "after", last_d.isNull() | (seq > last_d))
        after = F.col(META + "after")
        aggs = [
            F.max((kind == "D").cast("int")).alias(META + "has_d"),
            F.sum(after.cast("int")).alias(META + "n_after"),
            F.min_by(kind, F.when(after, seq)).alias(META + "first_kind"),
            F.max_by(F.col(LSN), seq).alias(LSN),
            F.min_by(F.col(FROM), F.when(after, seq)).alias(FROM),
            (F.max(F.when(F.col(AWAY), seq)) > F.min(seq)).alias(TOUCHED),
        ]
        for c in values:
            known = after & ~F.array_contains(keep, c)
            aggs.append(F.max_by(F.col(quoted(c)), F.when(known, seq)).alias(c))
            aggs.append(F.max(known.cast("int")).alias(META + "k_" + c))
        g = marked.groupBy(*quoted_all(key)).agg(*aggs)
        net_kind = (F.when(F.col(META + "n_after") == 0, F.lit("D"))
                    .when(F.col(META + "has_d") == 1, F.lit("R"))
                    .when(F.col(META + "first_kind") == "I", F.lit("I"))
                    .otherwise(F.lit("U")))
        unknown = F.array_compact(F.array(*[F.when(F.col(quoted(META + "k_" + c)) == 0, F.lit(c)) for c in values])) \
            if values else F.array().cast("array<string>")
        return g.select(
            net_kind.alias(KIND),
            F.when(net_kind == "D", F.array().cast("array<string>")).otherwise(unknown).alias(KEEP),
            F.col(LSN), F.when(net_kind.isin("I", "R"), F.col(FROM)).alias(FROM),
            F.coalesce(F.col(TOUCHED), F.lit(False)).alias(TOUCHED), *[F.col(quoted(c)) for c in columns])

    return step


def single_event_net(key: Sequence[str], columns: Sequence[str]) -> Step:
    """Step: ``compact`` for a batch in which no key has more than one event — the same rows, without a shuffle.

    When every key has exactly one event (after ``to_key_events``), its net change is that event:
    a DELETE stays ``D`` with no values, an INSERT ``I`` (with its moved-from key), an UPDATE ``U``;
    a column the event does not know (listed in its keep list) is null and kept. Nothing changed
    the key before a key change moved it away, so ``_pgl_touched`` is false. Whether a batch is
    such a batch is decided outside this pure step (``batches.keys_never_repeat``); on a batch
    with repeated keys this step would keep several rows per key, so only use it there.
    """
    values = [c for c in columns if c not in key]

    def step(df: DataFrame) -> DataFrame:
        kind, keep = F.col(KIND), F.col(KEEP)
        is_delete = kind == "D"
        empty = F.array().cast("array<string>")
        unknown = (F.filter(F.array(*[F.lit(c) for c in values]), lambda x: F.coalesce(F.array_contains(keep, x),
                                                                                          F.lit(False)))
                   if values else empty)
        return df.select(
            kind.alias(KIND), F.when(is_delete, empty).otherwise(unknown).alias(KEEP), F.col(LSN),
            F.when(kind == "I", F.col(FROM)).alias(FROM), F.lit(False).alias(TOUCHED),
            *[F.col(quoted(c)) if c in key else
              F.when(~is_delete & ~F.coalesce(F.array_contains(keep, c), F.lit(False)), F.col(quoted(c))).alias(c)
              for c in columns])

    return step


def to_appends(columns: Sequence[str]) -> Step:
    """Step: keyless (insert-only) tables — every INSERT is its own row, nothing is netted.

    Output columns match ``compact`` (kind ``I``, nothing kept, not touched) plus ``_pgl_seq`` for
    ``void_before``. UPDATE/DELETE never reach here: the runner refuses them first
    (``planning.update_delete_problem``), as PostgreSQL refuses them on the publisher.
    """

    def step(df: DataFrame) -> DataFrame:
        new = F.col(META + "new")
        return df.where(F.col(META + "op") == "I").select(
            F.lit("I").alias(KIND), _seq(F.lit(1)).alias(SEQ), F.col(META + "lsn").alias(LSN),
            F.array().cast("array<string>").alias(KEEP), F.lit(False).alias(TOUCHED),
            *[new.getField(c).alias(c) for c in columns])

    return step


def first_update_or_delete(df: DataFrame) -> tuple[int, int | None]:
    """(count, first LSN) of UPDATE/DELETE changes in a staged frame — one small Spark job."""
    row = (df.where(F.col(META + "op").isin("U", "D"))
           .agg(F.count(F.lit(1)).alias("n"), F.min(F.col(META + "lsn")).alias("lsn")).collect()[0])
    return int(row["n"]), (int(row["lsn"]) if row["lsn"] is not None else None)
