"""/docs (Swagger UI), /redoc and /openapi.json, with the UI's scripts and styles served by the service itself.

The assets ship in the ``fastapi-offline`` package (Swagger UI and ReDoc builds): the pages render on a host
without internet access, where FastAPI's defaults (a CDN) leave them blank.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).parent / "static"
ASSETS_URL = "/docs-assets"

router = APIRouter(include_in_schema=False)


def assets() -> StaticFiles:
    return StaticFiles(directory=ASSETS)


@router.get("/openapi.json")
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


def _page(request: Request, ui: str) -> tuple[str, dict[str, str]]:
    """The app's root path (where a proxy serves the app under a prefix, every link starts with it) and what every
    docs page takes: the URL of the OpenAPI schema and the page's title."""
    root = request.scope.get("root_path", "")
    return root, {"openapi_url": f"{root}/openapi.json", "title": f"{request.app.title} - {ui}"}


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root, page = _page(request, "Swagger UI")
    return get_swagger_ui_html(
        **page, swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css", swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        oauth2_redirect_url=f"{root}/docs/oauth2-redirect", swagger_ui_parameters={"persistAuthorization": True},
    )


@router.get("/docs/oauth2-redirect")
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root, page = _page(request, "ReDoc")
    return get_redoc_html(**page, redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
                          redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png", with_google_fonts=False)
