"""The API's documentation pages, served from local files: ``/docs`` (Swagger UI) and
``/redoc`` (ReDoc), both reading the OpenAPI 3.1 document FastAPI writes at ``/openapi.json``.

FastAPI's defaults load both from a CDN; a router on a plant or lab network reaches none, so
the files come from a wheel instead (fastapi-offline, which ships Swagger UI 5 and ReDoc 2:
both read OpenAPI 3.1 — Swagger UI 3, as swagger-ui-bundle ships, reads only 3.0 and shows
"Unable to render this definition"). The pages name no outside host: no Google Fonts for
ReDoc, the favicon local too — and a Content-Security-Policy that lets the browser load
nothing from elsewhere (ReDoc's sidebar asks a CDN for its maker's logo; the policy stops it).
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["add_docs", "DOCS_STATIC"]

#: Where the documentation's script and style files are served.
DOCS_STATIC = "/docs-static"

#: What the documentation pages may load: this router's files only. Inline script and style
#: are the pages' own (FastAPI's page templates); ReDoc's search runs in a blob: worker.
_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'"
)


def add_docs(app: FastAPI, *, title: str) -> None:
    """Serve ``/docs`` and ``/redoc`` on *app*, and their files under `DOCS_STATIC`."""
    bundle = files("fastapi_offline") / "static"
    app.mount(DOCS_STATIC, StaticFiles(directory=str(bundle)), name="docs-static")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return _confined(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{title} — API",
                swagger_js_url=f"{DOCS_STATIC}/swagger-ui-bundle.js",
                swagger_css_url=f"{DOCS_STATIC}/swagger-ui.css",
                swagger_favicon_url=f"{DOCS_STATIC}/favicon.png",
            )
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return _confined(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{title} — API",
                redoc_js_url=f"{DOCS_STATIC}/redoc.standalone.js",
                redoc_favicon_url=f"{DOCS_STATIC}/favicon.png",
                with_google_fonts=False,
            )
        )


def _confined(page: HTMLResponse) -> HTMLResponse:
    page.headers["Content-Security-Policy"] = _CSP
    return page
