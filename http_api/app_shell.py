"""``/app/``: the installable phone app (its files are ``static/app/``), served like the
monitor: the shell is open, every call for data it makes carries the user's token and goes
through the gate.

The files are a mount, not routes, so they need no credentials (a browser must load the
page before it can ask its user for a token) and stay out of the OpenAPI document. ``/app``
redirects to ``/app/``, keeping its query (``/app?pattern=…`` is a shared subscription).
Each answer says ``Cache-Control: no-cache`` (the service worker keeps the offline copy and
checks for a newer one) and carries a Content-Security-Policy: scripts and styles of this
router only, no inline script, no plugin, nothing framed; ``connect-src`` is open to other
routers of the mesh, which the app roams to.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

__all__ = ["add_app_shell", "APP_PATH", "APP_CSP"]

#: Where the app is served (its start URL and its service worker's scope).
APP_PATH = "/app"

#: What the app's pages may load and call.
APP_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self' http: https:; worker-src 'self'; manifest-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

_TYPES = {".webmanifest": "application/manifest+json", ".js": "text/javascript"}


class _AppFiles(StaticFiles):
    """The app's files with the headers the module docstring names."""

    def file_response(
        self, full_path: Any, stat_result: Any, scope: Any, status_code: int = 200
    ) -> Response:
        response: Response = super().file_response(full_path, stat_result, scope, status_code)
        for suffix, media in _TYPES.items():
            if str(full_path).endswith(suffix):
                response.headers["content-type"] = media
        response.headers["Cache-Control"] = "no-cache"
        response.headers["Content-Security-Policy"] = APP_CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        if str(full_path).endswith("sw.js"):
            response.headers["Service-Worker-Allowed"] = APP_PATH + "/"
        return response


def add_app_shell(app: FastAPI) -> None:
    """Serve the phone app under `APP_PATH` on *app*."""
    directory = files("aa.http_api") / "static" / "app"
    app.mount(APP_PATH, _AppFiles(directory=str(directory), html=True), name="app")
