"""`/docs`: Swagger UI from the assets the `swagger-ui-py` package ships, so the API docs work offline.

FastAPI's default page loads Swagger UI from a CDN, which a machine without
internet (or a strict network policy) shows as a blank page.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles


def _swagger_assets() -> Path:
    """The package's static folder, found without importing it (its import pulls in jinja2 and yaml)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed; pip install canvasread")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


ASSETS_PATH = "/docs/assets"


def add_docs(app: FastAPI) -> None:
    """Serve the Swagger UI page at /docs and its assets under /docs/assets (public, like the playground's)."""

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} API",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
        )

    app.mount(ASSETS_PATH, StaticFiles(directory=_swagger_assets()), name="docs-assets")
