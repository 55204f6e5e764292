"""Operators for the pipeline's preparatory steps: ensure publication/slot, check WAL retention, reset a target."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_provider_pglogical.pipeline.spec import PipelineSpec

if TYPE_CHECKING:
    from airflow.sdk import Context


class EnsureReplicationOperator(BaseOperator):
    """Make sure the spec's publication and slot exist; create them when ``source.create`` is true.

    Safe to re-run: existing objects are left alone (creation is ``IF NOT EXISTS``-like), and a
    publication missing one of the spec's tables fails with a SpecError instead of being altered.

    :param spec: the validated pipeline spec.
    """

    ui_color = "#e8daef"

    def __init__(self, *, spec: PipelineSpec, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_pglogical.pipeline.steps import ensure_replication, source_hook

        with source_hook(self.spec) as hook:
            result = ensure_replication(self.spec, hook)
        self.log.info("publication %s (created: %s), slot %s at %s (created: %s)", result["publication"],
                      result["created_publication"], result["slot"], result["confirmed_flush_lsn"],
                      result["created_slot"])
        return result


class WalRetentionCheckOperator(BaseOperator):
    """Fail with a typed error before ``max_slot_wal_keep_size`` can invalidate the slot.

    Raises SlotWalRetentionError when the slot is ``unreserved`` or its ``safe_wal_size`` is below
    ``min_safe_wal_bytes`` (default: the spec's ``source.min_safe_wal_bytes``), and
    SlotInvalidatedError when it is already ``lost``. Returns the slot summary.

    :param spec: the validated pipeline spec.
    :param min_safe_wal_bytes: override of the spec's threshold. (templated)
    """

    template_fields: Sequence[str] = ("min_safe_wal_bytes",)
    ui_color = "#fadbd8"

    def __init__(self, *, spec: PipelineSpec, min_safe_wal_bytes: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.min_safe_wal_bytes = min_safe_wal_bytes

    def execute(self, context: Context) -> dict[str, Any]:
        from dataclasses import replace

        from airflow_provider_pglogical.hooks.sizes import parse_size
        from airflow_provider_pglogical.pipeline.steps import check_retention, source_hook

        spec = self.spec
        if self.min_safe_wal_bytes not in (None, ""):
            spec = replace(spec, source=replace(spec.source, min_safe_wal_bytes=parse_size(self.min_safe_wal_bytes)))
        with source_hook(spec) as hook:
            summary = check_retention(spec, hook)
        self.log.info("slot %s: wal_status %s, safe_wal_size %s, lag %s bytes", summary["slot"],
                      summary["wal_status"], summary["safe_wal_size"], summary["lag_bytes"])
        return summary


class ResetTargetOperator(BaseOperator):
    """Empty the spec's target tables and forget the slot's watermarks (for a replay from staging).

    :param spec: the validated pipeline spec.
    :param enabled: skip the reset when false. (templated)
    """

    template_fields: Sequence[str] = ("enabled",)
    ui_color = "#f5b7b1"

    def __init__(self, *, spec: PipelineSpec, enabled: bool | str = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.enabled = enabled

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_provider_pglogical.pipeline.runs import reset_target

        if str(self.enabled).lower() in ("false", "0", "no", ""):
            self.log.info("reset disabled: replaying on top of the current target")
            return {"truncated": []}
        return reset_target(self.spec, log=self.log.info)
