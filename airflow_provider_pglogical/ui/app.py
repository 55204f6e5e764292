"""The FastAPI app behind the UI view: the pipelines of a specs folder, and each one's run report.

Pipelines are the spec files (``*.yaml``, ``*.yml``, ``*.json``) of ``[pglogical] specs_folder``
(``AIRFLOW__PGLOGICAL__SPECS_FOLDER``), by default ``<dags_folder>/specs``; a pipeline's name is its file's stem.
A spec that does not load is listed with its one-line error instead of breaking the page.

Every request must carry an Airflow login (the UI's session cookie, or ``Authorization: Bearer`` with a token
from ``POST /auth/token``), checked by Airflow's own auth manager. The plugin is loaded by every Airflow
process, so this module imports only FastAPI; the report's modules are imported by the first request.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse

if TYPE_CHECKING:  # type-only: the spec is loaded by the request handlers, which import its module then
    from airflow_provider_pglogical.pipeline.spec import PipelineSpec

SPEC_SUFFIXES = (".yaml", ".yml", ".json")


def specs_folder() -> Path:
    """``[pglogical] specs_folder``, else ``<dags_folder>/specs``."""
    from airflow.configuration import conf

    configured = conf.get("pglogical", "specs_folder", fallback=None)
    if configured:
        return Path(os.path.expanduser(configured))
    return Path(os.path.expanduser(conf.get("core", "dags_folder"))) / "specs"


def spec_files(folder: Path) -> dict[str, Path]:
    """Pipeline name → spec file, in name order."""
    if not folder.is_dir():
        return {}
    return {p.stem: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix in SPEC_SUFFIXES}


async def require_login(request: Request) -> None:
    """Airflow's own check of the caller's login: 401 without one, 403 with an invalid token."""
    from airflow.api_fastapi.core_api.security import bearer_scheme, get_user

    await get_user(request, None, await bearer_scheme(request))


def _load(name: str, folder: Path) -> PipelineSpec:
    from airflow_provider_pglogical.pipeline.spec import load_spec

    path = spec_files(folder).get(name)
    if path is None:
        raise HTTPException(status_code=404, detail=f"no pipeline spec named {name!r} in {folder}")
    return load_spec(str(path))


def _since(value: str | None) -> Any:
    from airflow_provider_pglogical.history.record import parse_since

    try:
        return parse_since(value) if value else None
    except ValueError as exc:
        raise HTTPException(status_code=400, detail=str(exc)) from None


def create_app(folder: Path | None = None) -> FastAPI:
    """The app; ``folder`` fixes the specs folder (default: read from Airflow's config on every request)."""
    app = FastAPI(title="pglogical pipelines", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(require_login)])

    def where() -> Path:
        return folder or specs_folder()

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        from airflow_provider_pglogical.pipeline.spec import load_spec
        from airflow_provider_pglogical.pipeline.target import target_kinds

        rows = []
        for name, path in spec_files(where()).items():
            try:
                spec = load_spec(str(path))
                found = target_kinds(spec)
                kinds = (", ".join(f"{n} ({kind})" for n, kind in found.items()) if spec.targets
                         else next(iter(found.values())))
                detail = f"slot {html.escape(spec.source.slot)} → {html.escape(kinds)}"
            except Exception as exc:  # noqa: BLE001 - one broken spec must not hide the others
                detail = html.escape(f"spec not loaded: {type(exc).__name__}: {' '.join(str(exc).split())}")
            rows.append(f'<li><a href="report/{html.escape(name)}">{html.escape(name)}</a> — {detail}</li>')
        body = "".join(rows) or f"<li>no pipeline specs in {html.escape(str(where()))}</li>"
        return ('<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>pglogical pipelines</title>'
                '<style>body{font-family:system-ui,sans-serif;margin:1.5em}</style></head><body>'
                f'<h1>pglogical pipelines</h1><ul id="pipelines">{body}</ul></body></html>')

    @app.get("/report/{name}", response_class=HTMLResponse)
    def report_page(name: str, since: str | None = Query(None, description="ISO time or age (24h, 7d)")) -> str:
        from airflow_provider_pglogical.pipeline.monitoring import report

        _data, page = report(_load(name, where()), since=_since(since))
        return page

    @app.get("/report/{name}/json")
    def report_json(name: str, since: str | None = Query(None, description="ISO time or age (24h, 7d)")) -> JSONResponse:
        from airflow_provider_pglogical.pipeline.monitoring import report

        data, _page = report(_load(name, where()), since=_since(since))
        return JSONResponse(data)

    return app
