"""A Delta mirror batch merged in one commit per key-hash bucket (``DeltaTarget.apply_net_buckets``, the
``max_merge_rows`` setting) against the one-commit reference: the same table, counts and watermark; killed between
two bucket commits, the watermark stays at the previous batch and the re-run ends equal to an uninterrupted apply."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_pglogical.apply.targets.delta.location import DeltaLocation
from airflow_provider_pglogical.apply.targets.delta.target import BUCKET_COMMITTED, DeltaTarget
from airflow_provider_pglogical.exceptions import ApplyError
from tests.conftest import REPO_ROOT
from tests.support import delta_buckets_child as child
from tests.unit.apply.delta.test_delta_stream import CHANGE, _kept, _net_rows, _split
from tests.unit.apply.delta.test_delta_target import COLUMNS, TYPES, net, rows_of


def _written(counts: dict[str, int]) -> int:
    return counts.get("inserted", 0) + counts.get("updated", 0)


def _history(location: DeltaLocation, target: str = "public.t") -> list[dict]:
    return DeltaTable(location.table_uri(target)).history()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.lists(CHANGE, max_size=25), batch=st.lists(CHANGE, max_size=40), cuts=st.integers(1, 5),
       truncated=st.booleans())
def test_one_commit_per_bucket_leaves_what_one_commit_leaves(base, batch, cuts, truncated):
    with tempfile.TemporaryDirectory() as tmp:
        one = DeltaTarget(DeltaLocation(f"{tmp}/one"), "s1", chunk_rows=None)
        per_bucket = DeltaTarget(DeltaLocation(f"{tmp}/per_bucket"), "s1", max_merge_rows=1)
        first = [("I", [], None, key, n, body) for _, _, key, n, body in base] or [("I", [], None, 0, 0, "")]
        first = list({r[3]: r for r in first}.values())  # one row per key
        for t in (one, per_bucket):
            t.apply_net("public.t", 0, 10, net(first), key=("id",), columns=COLUMNS, type_names=TYPES,
                        truncated=False)
        changes = net(_net_rows(batch))
        loaded = len(_history(per_bucket.location))
        want = one.apply_net("public.t", 10, 20, changes, key=("id",), columns=COLUMNS, type_names=TYPES,
                             truncated=truncated)
        got = per_bucket.apply_net_buckets("public.t", 10, 20, iter(_split(changes, cuts)), count=cuts,
                                           rows=changes.num_rows, kept=_kept(changes), key=("id",), columns=COLUMNS,
                                           type_names=TYPES, truncated=truncated)
        assert rows_of(per_bucket.location) == rows_of(one.location)
        if truncated:  # a row the TRUNCATE's bucket deleted and a later bucket re-inserted counts as both
            assert _written(got.rows) == _written(want.rows)
        else:
            assert got.rows == want.rows
        assert got.committed and per_bucket.watermark("public.t") == 20
        commits = _history(per_bucket.location)[:-loaded]  # the batch's, newest first
        assert 1 <= len(commits) <= cuts  # at most one per bucket
        assert "pglogical.bucket" not in commits[0]  # the last: with the watermark
        assert all("pglogical.bucket" in c for c in commits[1:])


def _run_child(lake: str, truncated: bool, kill_at: str) -> int:
    proc = subprocess.run([sys.executable, "-m", "tests.support.delta_buckets_child",
                           json.dumps({"lake": lake, "truncated": truncated, "kill_at": kill_at})],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, child.KILLED), proc.stderr[-3000:]
    return proc.returncode


def _load_base(location: DeltaLocation) -> DeltaTarget:
    target = DeltaTarget(location, child.SLOT)
    target.apply_net(child.TARGET, *child.BASE, child.base(), key=child.KEY, columns=child.COLUMNS,
                     type_names=child.TYPES, truncated=False)
    return target


@pytest.mark.parametrize("truncated", [False, True], ids=["changes", "truncate-then-changes"])
def test_killed_between_bucket_commits_the_rerun_ends_equal_to_an_uninterrupted_apply(tmp_path, truncated):
    clean = _load_base(DeltaLocation(str(tmp_path / "clean")))
    changes = child.batch(truncated)
    clean.apply_net(child.TARGET, *child.BATCH, changes, key=child.KEY, columns=child.COLUMNS, type_names=child.TYPES,
                    truncated=truncated)
    crashed = _load_base(DeltaLocation(str(tmp_path / "crashed")))
    before = rows_of(crashed.location, child.TARGET)
    loaded = len(_history(crashed.location, child.TARGET))
    lake = str(tmp_path / "crashed")

    # One kill: after the first bucket's commit (the TRUNCATE's too, when there is one), the watermark still at the
    # previous batch. Not killed again later in the rerun: two buckets committed, the watermark where it was, is
    # the same state, and its rerun merges every bucket again as this one's does. The reruns need no child.
    assert _run_child(lake, truncated, f"{BUCKET_COMMITTED}:1") == child.KILLED
    partly = rows_of(crashed.location, child.TARGET)
    assert partly not in (before, rows_of(clean.location, child.TARGET))  # a bucket applied, not the batch
    assert crashed.watermark(child.TARGET) == child.BASE[1]  # the batch is still to do
    assert child.apply_batch(lake, truncated).committed

    assert rows_of(crashed.location, child.TARGET) == rows_of(clean.location, child.TARGET)
    assert crashed.watermark(child.TARGET) == child.BATCH[1]
    assert not child.apply_batch(lake, truncated).committed  # at the watermark: nothing more
    # One bucket commit, then every bucket's: the rerun merged the first bucket again.
    assert len(_history(crashed.location, child.TARGET)) == loaded + 1 + child.BUCKETS


def test_fewer_net_changes_than_planned_leave_the_watermark(tmp_path):
    target = _load_base(DeltaLocation(str(tmp_path / "lake")))
    changes = child.batch(False)
    parts = child.buckets(changes)
    with pytest.raises(ApplyError, match=r"public.t: \d+ net change.s. reached the MERGE commits, 90 were planned"):
        target.apply_net_buckets(child.TARGET, *child.BATCH, iter(parts[:1] + parts[2:]), count=2,
                                 rows=changes.num_rows, kept=child.kept(changes), key=child.KEY,
                                 columns=child.COLUMNS, type_names=child.TYPES, truncated=False)
    assert target.watermark(child.TARGET) == child.BASE[1]
    with pytest.raises(ApplyError, match="in fewer buckets than the 3 planned"):
        target.apply_net_buckets(child.TARGET, *child.BATCH, iter(parts[:2]), count=3, rows=changes.num_rows,
                                 kept=child.kept(changes), key=child.KEY, columns=child.COLUMNS,
                                 type_names=child.TYPES, truncated=False)
    assert target.watermark(child.TARGET) == child.BASE[1]


def test_max_merge_rows_is_at_least_one(tmp_path):
    with pytest.raises(ApplyError, match="max_merge_rows must be at least 1, got 0"):
        DeltaTarget(DeltaLocation(str(tmp_path / "lake")), "s1", max_merge_rows=0)


def test_an_empty_bucket_commits_nothing(tmp_path):
    target = _load_base(DeltaLocation(str(tmp_path / "lake")))
    loaded = len(_history(target.location))
    changes = net([("U", [], None, 1, 7, "u")])
    empty = changes.slice(0, 0)
    outcome = target.apply_net_buckets("public.t", *child.BATCH, iter([empty, changes, empty]), count=3, rows=1,
                                       kept=(), key=("id",), columns=COLUMNS, type_names=TYPES, truncated=False)
    assert outcome.committed and outcome.rows.get("updated") == 1 and target.watermark("public.t") == 20
    # The middle bucket's commit, and the last bucket's (empty: the watermark alone).
    assert len(_history(target.location)) == loaded + 2
    assert rows_of(target.location)[1] == (1, 7, "u")
