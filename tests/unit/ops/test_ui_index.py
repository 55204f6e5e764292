"""The UI view's index of pipelines: each spec's slot and its targets' kinds, as ``pipeline/target.py`` names them (the
login check is Airflow's, exercised by ``tests/system/test_ui_plugin.py``; here it is left out)."""

from __future__ import annotations

import yaml
from fastapi.testclient import TestClient

from airflow_provider_pglogical.ui.app import create_app, require_login
from tests.unit.pipeline.test_spec import VALID
from tests.unit.pipeline.test_spec_targets import two_targets


def test_the_index_lists_each_pipelines_slot_and_the_kinds_of_its_targets(tmp_path):
    (tmp_path / "fanout.yaml").write_text(yaml.safe_dump(two_targets(), sort_keys=False))
    (tmp_path / "single.yaml").write_text(yaml.safe_dump(VALID, sort_keys=False))
    unknown = two_targets()
    unknown["targets"]["lake"]["kind"] = "parquet"
    (tmp_path / "unknown.yaml").write_text(yaml.safe_dump(unknown, sort_keys=False))
    app = create_app(tmp_path)
    app.dependency_overrides[require_login] = lambda: None
    index = TestClient(app).get("/").text
    slot = VALID["source"]["slot"]
    assert f'<a href="report/fanout">fanout</a> — slot {slot} → reporting (postgres), lake (iceberg)' in index
    assert f'<a href="report/single">single</a> — slot {slot} → postgres' in index
    assert '<a href="report/unknown">unknown</a> — spec not loaded: SpecError' in index
