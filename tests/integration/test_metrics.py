"""Per-batch metrics reach a real Airflow Stats backend: OpenTelemetry over OTLP/HTTP to a collector on 127.0.0.1.

The collector is a plain HTTP server in the test decoding ``ExportMetricsServiceRequest`` protobufs;
Airflow's Stats is initialised as the task runner does it (``stats_utils.get_stats_factory()``)
with ``[metrics] otel_on``. (StatsD would need the ``statsd`` package, which the lock does not hold.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pytest

from scripts.harness.pgserver import make_target
from tests.support.stage import BatchSpec, Chg, Col, Rel, write_batch

Points = dict[str, list[tuple[dict[str, str], float]]]


class Collector(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.points: Points = {}
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/metrics"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportMetricsServiceRequest.FromString(body)
        server: Collector = self.server  # type: ignore[assignment]
        with server.lock:
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        kind = metric.WhichOneof("data")
                        for p in getattr(metric, kind).data_points:
                            attrs = {a.key: a.value.string_value for a in p.attributes}
                            value = (p.sum if kind in ("histogram", "exponential_histogram")
                                     else p.as_int if p.HasField("as_int") else p.as_double)
                            server.points.setdefault(metric.name, []).append((attrs, float(value)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def collector(monkeypatch) -> Iterator[Collector]:
    from airflow.sdk.observability import stats
    from airflow.sdk.observability.metrics import stats_utils

    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_ON", "True")
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_PREFIX", "airflow")
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS", "600000")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", server.endpoint)
    stats.initialize(factory=stats_utils.get_stats_factory(), export_legacy_names=False)
    try:
        yield server
    finally:
        from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
        from opentelemetry import metrics

        metrics.get_meter_provider().shutdown()  # type: ignore[attr-defined]  # last export while the server is up
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        server.shutdown()
        server.server_close()


def flush(collector: Collector) -> Points:
    from opentelemetry import metrics

    metrics.get_meter_provider().force_flush()  # type: ignore[attr-defined]
    with collector.lock:
        return {k: list(v) for k, v in collector.points.items()}


def test_a_decode_run_sends_slot_lag_and_staged_changes_to_the_stats_backend(collector, pg_conn, pg_dsn, pg_server,
                                                                             pg_dbname, tmp_path, monkeypatch):
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_provider_pglogical.hooks.pglogical import PgLogicalHook
    from airflow_provider_pglogical.operators.decode import PgLogicalDecodeOperator

    with pg_conn.cursor() as cur:
        cur.execute("CREATE TABLE items (id int PRIMARY KEY, v text); CREATE PUBLICATION pub FOR TABLE items")
    with PgLogicalHook.from_dsn(pg_dsn) as hook:
        hook.create_slot("metrics_slot")
    with pg_conn.cursor() as cur:
        cur.execute("INSERT INTO items SELECT g, 'x' FROM generate_series(1, 37) g")
        cur.execute("UPDATE items SET v = 'y' WHERE id <= 5")
    monkeypatch.setenv("AIRFLOW_CONN_METRICS_SRC", pg_server.uri(pg_dbname))
    lines: list[str] = []
    op = PgLogicalDecodeOperator(task_id="decode", slot="metrics_slot", publication="pub",
                                 staging_uri=str(tmp_path / "stage"), postgres_conn_id="metrics_src")
    op.log.info = lambda msg, *args: lines.append(msg % args if args else msg)  # type: ignore[method-assign]
    summary = op.execute({"outlet_events": OutletEventAccessors()})
    points = flush(collector)

    assert summary["changes"] == 42
    assert [v for _, v in points["airflow.pglogical.metrics_slot.decode.staged_changes"]] == [42]
    assert points["airflow.pglogical.metrics_slot.decode.staged_changes"][0][0] == {"slot": "metrics_slot"}
    (lag_bytes,) = [v for _, v in points["airflow.pglogical.metrics_slot.slot_lag_bytes"]]
    assert 0 <= lag_bytes < 64 * 1024  # caught up, but for WAL the server writes on its own (running xacts)
    (lag_seconds,) = [v for _, v in points["airflow.pglogical.metrics_slot.slot_lag_seconds"]]
    assert 0 <= lag_seconds < 120
    assert points["airflow.pglogical.metrics_slot.decode.duration"][0][1] > 0
    line = next(x for x in lines if x.startswith("pglogical decode "))
    assert "slot=metrics_slot" in line and "changes=42" in line and f"slot_lag_bytes={int(lag_bytes)}" in line


ITEMS = Rel("public", "items", (Col("id", pa.int64(), "bigint", True), Col("v", pa.string(), "text")))


def test_an_apply_sends_duration_and_rows_per_table_for_each_batch(collector, spark, tmp_path, pg_server):
    from airflow_provider_pglogical.apply.config import ApplyConfig
    from airflow_provider_pglogical.apply.runner import apply_slot
    from airflow_provider_pglogical.metrics.batches import apply_metrics_from_report, emit_apply_batch

    _, dsn = make_target(pg_server)
    write_batch(tmp_path, "s1", BatchSpec(0x100, 0x200, {ITEMS: [
        Chg("I", 0x110 + i, 0, new={"id": i, "v": "a"}) for i in range(7)]}))
    write_batch(tmp_path, "s1", BatchSpec(0x200, 0x300, {ITEMS: [
        Chg("I", 0x210, 0, new={"id": 100, "v": "b"}), Chg("D", 0x220, 0, old={"id": 1}, old_key_only=True)]}))
    lines: list[str] = []
    apply_slot(spark, ApplyConfig(slot="s1", staging_root=str(tmp_path)), dsn,
               on_batch=lambda r: emit_apply_batch(apply_metrics_from_report("s1", asdict(r)), lines.append))
    points = flush(collector)

    rows = points["airflow.pglogical.s1.apply.rows.public.items"]
    assert sorted(v for _, v in rows) in ([2, 7], [9])  # two data points, or one cumulative sum
    assert rows[-1][0] == {"slot": "s1", "table": "public.items"}
    assert sum(v for _, v in points["airflow.pglogical.s1.apply.batches"]) == 2
    assert points["airflow.pglogical.s1.apply.duration"][0][1] > 0
    assert len(lines) == 2 and all(line.startswith("pglogical apply slot=s1 batch=") for line in lines)
    assert "rows public.items=" in lines[0] and "+7" in lines[0]
    assert "+1" in lines[1] and "-1" in lines[1]
