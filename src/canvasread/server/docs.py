"""`/docs`: Swagger UI from the assets the `swagger-ui-py` package ships, so the API docs work offline.

FastAPI's default page loads Swagger UI from a CDN, which a machine without
internet (or a strict network policy) shows as a blank page. The page itself
holds no data and is public; its script (`static/docs.js`) sends the
playground's API key with every request, `/openapi.json` included, so with
keys on the docs open from the playground as they do without.
"""

from __future__ import annotations

import importlib.util
from html import escape
from pathlib import Path

from fastapi import FastAPI, Request
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles


def _swagger_assets() -> Path:
    """The package's static folder, found without importing it (its import pulls in jinja2 and yaml)."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed; pip install canvasread")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


ASSETS_PATH = "/docs/assets"
_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="stylesheet" href="{assets}/swagger-ui.css">
  <link rel="icon" href="{assets}/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{assets}/swagger-ui-bundle.js"></script>
  <script src="{root}/static/docs.js" data-openapi="{openapi}"></script>
</body>
</html>
"""


def add_docs(app: FastAPI) -> None:
    """Serve the Swagger UI page at /docs and its assets under /docs/assets (public, like the playground's)."""

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = escape(request.scope.get("root_path", ""))
        page = _PAGE.format(
            title=escape(f"{app.title} API"),
            assets=f"{root}{ASSETS_PATH}",
            root=root,
            openapi=f"{root}{escape(app.openapi_url or '')}",
        )
        return HTMLResponse(page)

    app.mount(ASSETS_PATH, StaticFiles(directory=_swagger_assets()), name="docs-assets")
