"""The Airflow 3 plugin (entry point ``airflow.plugins``): the report app mounted on the api-server at
``/pglogical`` and a "pglogical pipelines" entry in the UI's navigation that opens it."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_provider_pglogical.ui.app import create_app

URL_PREFIX = "/pglogical"


class PgLogicalPlugin(AirflowPlugin):
    name = "pglogical"
    fastapi_apps = [{"name": "pglogical pipelines", "app": create_app(), "url_prefix": URL_PREFIX}]
    external_views = [{"name": "pglogical pipelines", "href": f"{URL_PREFIX}/", "destination": "nav",
                       "url_route": "pglogical", "category": "browse"}]
