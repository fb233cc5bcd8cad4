"""Origins, in a real browser: a page served from a second origin (another port) tries the
autocomplete WebSocket and a Connect call. With the default settings both are refused (the
handshake gets 403, the call's preflight 403), counted and logged; with that origin in
`allowed_origins` both work. The server's own page and clients without an Origin are never
refused. Debian's Chromium, headless, as the autocomplete page's test drives it."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from headless_chromium import headless_chromium
from http_calls import SERVICE_PATH, post
from metrics_scrape import scrape
from prometheus_client import CollectorRegistry
from selenium import webdriver
from selenium.webdriver.support.wait import WebDriverWait

from lmserve.server.front.process.app import BackgroundServer, start_background_server
from lmserve.server.settings import load_settings

# The second origin's page: it tries both calls and writes what happened into `window.done`.
PAGE = """<!doctype html><meta charset="utf-8"><title>other origin</title><script>
const target = new URLSearchParams(location.search).get("target");
const result = {};
const ws = new WebSocket("ws://" + target + "/ws/complete");
ws.onopen = () => { result.ws = "open"; ws.close(); finish(); };
ws.onerror = () => { result.ws = result.ws || "error"; finish(); };
fetch("http://" + target + "/lmserve.v1.LanguageModelService/ListModels", {
  method: "POST", headers: {"content-type": "application/json"}, body: "{}"})
  .then(r => r.json()).then(j => { result.fetch = "ok:" + j.models.length; finish(); })
  .catch(e => { result.fetch = "failed"; finish(); });
function finish() { if (result.ws && result.fetch) window.done = JSON.stringify(result); }
</script>"""


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def other_origin() -> Iterator[str]:
    """A plain web server on another port: a page of a different origin."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PAGE.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


def _server(model_repository: Path, **settings: Any) -> BackgroundServer:
    base = {
        "model_repository": model_repository,
        "host": "127.0.0.1",
        "port": 0,
        "http_port": 0,
        "metrics_host": "127.0.0.1",
        "metrics_port": 0,
    }
    return start_background_server(
        load_settings({**base, **settings}), registry=CollectorRegistry()
    )


def _visit(browser: webdriver.Chrome, origin: str, server: BackgroundServer) -> dict[str, str]:
    browser.get(f"{origin}/?target=127.0.0.1:{server.http_port}")
    done = WebDriverWait(browser, 30).until(lambda d: d.execute_script("return window.done"))
    result: dict[str, str] = json.loads(done)
    return result


def _refused(server: BackgroundServer) -> dict[str, float]:
    """lmserve_http_refused_origins_total by kind, as the server's /metrics says."""
    return {
        dict(labels)["kind"]: value
        for (name, labels), value in scrape(server).items()
        if name == "lmserve_http_refused_origins_total"
    }


def test_another_origin_is_refused_by_default(
    browser: webdriver.Chrome,
    other_origin: str,
    server: BackgroundServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The session's server (no allowed_origins; its metrics on a port of their own): the
    # refusals are counted from what it had counted before.
    before = _refused(server)
    assert _visit(browser, other_origin, server) == {"ws": "error", "fetch": "failed"}
    refused = _refused(server)
    for kind in ("websocket", "http"):
        assert refused.get(kind, 0) >= before.get(kind, 0) + 1, (before, refused)
    warning = "not the server's own, nor in allowed_origins"
    assert any(warning in r.getMessage() for r in caplog.records)
    # Without an Origin (a client, not a page) and from the server's own page: answered.
    status, _, _ = post(
        server.http_port,
        f"{SERVICE_PATH}/ListModels",
        b"{}",
        {"content-type": "application/json"},
    )
    assert status == 200
    own = f"http://127.0.0.1:{server.http_port}"
    status, headers, _ = post(
        server.http_port,
        f"{SERVICE_PATH}/ListModels",
        b"{}",
        {"content-type": "application/json", "origin": own},
    )
    assert status == 200
    status, _, body = post(
        server.http_port,
        f"{SERVICE_PATH}/ListModels",
        b"{}",
        {"content-type": "application/json", "origin": other_origin},
    )
    assert status == 403 and b"allowed_origins" in body
    with urllib.request.urlopen(f"{own}/", timeout=10) as page:  # the server's own page
        assert page.status == 200


def test_a_listed_origin_may_call(
    browser: webdriver.Chrome, other_origin: str, model_repository: Path
) -> None:
    with _server(model_repository, allowed_origins=[other_origin]) as server:
        result = _visit(browser, other_origin, server)
        assert result["ws"] == "open"
        assert result["fetch"].startswith("ok:") and int(result["fetch"][3:]) > 0
        status, headers, _ = post(
            server.http_port,
            f"{SERVICE_PATH}/ListModels",
            b"{}",
            {"content-type": "application/json", "origin": other_origin},
        )
        assert status == 200 and headers["access-control-allow-origin"] == other_origin
