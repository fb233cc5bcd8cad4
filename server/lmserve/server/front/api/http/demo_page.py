"""The autocomplete page: `/` and `/demo`, with its script and style under `/static/`.

Plain HTML, JavaScript and CSS from `static/` (shipped in the wheel beside this module), no
build step and nothing from the internet: the Content-Security-Policy allows this origin only.
The page lists models through the Connect front (`ListModels`) and types into `/ws/complete`
(`complete_socket`); it needs no token itself, its calls do.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
PAGE = STATIC / "index.html"
_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # Revalidated each time (ETag): a new server's page is never hidden by a cached one.
    "cache-control": "no-cache",
}


async def _page(request: Request) -> Response:
    return FileResponse(PAGE, media_type="text/html; charset=utf-8", headers=_HEADERS)


class _Static(StaticFiles):
    """The page's files, revalidated each time like the page."""

    def file_response(self, *args: object, **kwargs: object) -> Response:
        response = super().file_response(*args, **kwargs)  # type: ignore[arg-type]
        response.headers.update(_HEADERS)
        return response


def demo_page_routes() -> list[BaseRoute]:
    """`/`, `/demo` (the page) and `/static/*` (its script, style and icon)."""
    return [
        Route("/", _page, methods=["GET", "HEAD"]),
        Route("/demo", _page, methods=["GET", "HEAD"]),
        Mount("/static", _Static(directory=STATIC), name="static"),
    ]
