"""The autocomplete page in a real browser: Debian's Chromium, headless, driven by Selenium
against a real server on the shipped kjv-lstm model. It types, sees the same suggestions the
gRPC client gets for the same text, accepts one with Tab, deletes back over it, and saves a
screenshot (to the test's tmp_path, and to $LMSERVE_SCREENSHOT when set).

The browser is part of the test environment (`.ci/run` installs `chromium` and
`chromium-driver`): without it these tests fail, they never skip.
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from headless_chromium import headless_chromium
from integration_data import AUTH_TOKEN
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.wait import WebDriverWait
from served import ServerFactory

from lmserve.client import LmServeClient
from lmserve.server.front.process.app import BackgroundServer

LSTM = "kjv-lstm"
TOKEN = AUTH_TOKEN
K = 4
WAIT = 30


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def lstm_server(serve: ServerFactory, kjv_repository: Path) -> Iterator[BackgroundServer]:
    # kjv-lstm and kjv3 (the session's `kjv_repository`), in a server of its own.
    with serve.private(kjv_repository) as s:
        yield s


def _wait(driver: webdriver.Chrome, what: str, condition: object) -> None:
    WebDriverWait(driver, WAIT).until(lambda d: condition(d), message=what)  # type: ignore[operator]


def _connected(driver: webdriver.Chrome) -> None:
    _wait(
        driver,
        "the page connected",
        lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "connected",
    )


def _answered(driver: webdriver.Chrome) -> list[str]:
    """The suggestions shown once the last keystroke sent is answered."""
    editor = driver.find_element(By.ID, "editor")
    listed = driver.find_element(By.ID, "suggestions")

    def shown(d: webdriver.Chrome) -> bool:
        sent = editor.get_attribute("data-sent")
        return (
            bool(sent) and listed.get_attribute("data-sequence") == sent and listed.is_displayed()
        )

    _wait(driver, "suggestions for the last keystroke", shown)
    return [str(item.get_attribute("data-word")) for item in _items(driver)]


def _items(driver: webdriver.Chrome) -> list[WebElement]:
    return driver.find_elements(By.CSS_SELECTOR, "#suggestions li")


def _highlighted(driver: webdriver.Chrome) -> str:
    [item] = driver.find_elements(By.CSS_SELECTOR, "#suggestions li[aria-selected='true']")
    return str(item.get_attribute("data-word"))


def _screenshot(driver: webdriver.Chrome, tmp_path: Path) -> Path:
    shot = tmp_path / "autocomplete.png"
    assert driver.save_screenshot(str(shot))
    wanted = os.environ.get("LMSERVE_SCREENSHOT")
    if wanted:
        Path(wanted).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, wanted)
    return shot


def test_the_page_and_its_files_come_from_this_server(server: BackgroundServer) -> None:
    """`/` and `/demo` are the page, its files under `/static/`; nothing is fetched from
    elsewhere (no absolute URL in any of them, and a CSP that allows this origin only)."""
    base = f"http://127.0.0.1:{server.http_port}"
    bodies = {}
    for path in ("/", "/demo", "/static/autocomplete.js", "/static/autocomplete.css"):
        with urllib.request.urlopen(base + path, timeout=10) as response:
            assert response.status == 200, path
            bodies[path] = response.read().decode()
            csp = response.headers["content-security-policy"]
            assert "default-src 'self'" in csp and "http" not in csp
            kind = response.headers["content-type"]
        assert kind.split(";")[0] == {"js": "text/javascript", "css": "text/css"}.get(
            path.rsplit(".", 1)[-1], "text/html"
        ), (path, kind)
    assert bodies["/"] == bodies["/demo"] and "static/autocomplete.js" in bodies["/"]
    for path, body in bodies.items():
        assert not re.search(r"(?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", body, re.IGNORECASE), path
    assert "ws/complete" in bodies["/static/autocomplete.js"]


def test_typing_shows_the_grpc_suggestions_and_tab_accepts(
    browser: webdriver.Chrome, lstm_server: BackgroundServer, tmp_path: Path
) -> None:
    browser.get(f"http://127.0.0.1:{lstm_server.http_port}/demo")
    _connected(browser)
    picker = Select(browser.find_element(By.ID, "model"))
    assert {o.get_attribute("value") for o in picker.options} == {LSTM, "kjv3"}
    picker.select_by_value("kjv3")
    _connected(browser)
    picker.select_by_value(LSTM)
    _connected(browser)
    k = browser.find_element(By.ID, "k")  # the page's default is 5
    k.send_keys(Keys.CONTROL, "a")
    k.send_keys(str(K), Keys.ENTER)
    assert k.get_property("value") == str(K)

    editor = browser.find_element(By.ID, "editor")
    editor.click()
    first = "In the beginning God created the heaven and the earth.\n"
    for key in first + "And God sa":  # one call a key: a typist's pace, not a paste's
        editor.send_keys(key)
    shown = _answered(browser)

    with LmServeClient(lstm_server.address) as client, client.complete(LSTM, k=K) as session:
        # The page's session as typed: the first sentence, then a new one (the "." ends it:
        # its last word is committed, then a reset, and the whole sentence joins the session's
        # history, which its cache counts).
        session.type(first.strip() + " ")
        session.reset()
        expected = [c.word for c in session.type("and god sa")]
        assert shown == expected and len(shown) == K and all(w.startswith("sa") for w in shown)
        assert _highlighted(browser) == shown[0]
        screenshot = _screenshot(browser, tmp_path)

        editor.send_keys(Keys.TAB)  # accepts the highlighted word
        assert editor.get_property("value") == f"{first}And God {shown[0]} "
        after = _answered(browser)
        assert after == [c.word for c in session.accept(shown[0])]

        editor.send_keys("unto m")
        choices = _answered(browser)
        assert choices == [c.word for c in session.type("unto m")]
        editor.send_keys(Keys.ARROW_DOWN, Keys.ARROW_DOWN, Keys.ARROW_DOWN, Keys.ARROW_UP)
        assert _highlighted(browser) == choices[2]
        editor.send_keys(Keys.TAB)
        assert editor.get_property("value") == f"{first}And God {shown[0]} unto {choices[2]} "
        assert _answered(browser) == [c.word for c in session.accept(choices[2])]

        editor.send_keys(Keys.BACKSPACE, Keys.BACKSPACE)  # back into the accepted word
        again = _answered(browser)
        assert again == [c.word for c in session.backspace(2)]
        assert choices[2] in again and all(w.startswith(choices[2][:-1]) for w in again)

    editor.send_keys(Keys.ESCAPE)
    _wait(
        browser,
        "Esc hides the list",
        lambda d: not d.find_element(By.ID, "suggestions").is_displayed(),
    )
    assert editor.get_property("value").endswith(f"unto {choices[2][:-1]}")
    last = browser.find_element(By.ID, "rtt-last").text
    assert last.endswith(" ms") and int(browser.find_element(By.ID, "rtt-n").text) > 10
    assert browser.find_element(By.ID, "session").text.startswith(f"{LSTM}/")
    assert screenshot.stat().st_size > 10_000


def test_a_click_accepts_and_a_reconnect_resends_the_context(
    browser: webdriver.Chrome, lstm_server: BackgroundServer
) -> None:
    browser.get(f"http://127.0.0.1:{lstm_server.http_port}/")
    _connected(browser)
    Select(browser.find_element(By.ID, "model")).select_by_value(LSTM)
    _connected(browser)
    editor = browser.find_element(By.ID, "editor")
    editor.click()
    editor.send_keys("and the lord spake unto mo")
    words = _answered(browser)
    _items(browser)[1].click()
    assert editor.get_property("value") == f"and the lord spake unto {words[1]} "
    next_words = _answered(browser)
    session = browser.find_element(By.ID, "session").text
    # A broken socket: the page reconnects, and its first message carries the model, the
    # session and the committed context; the answers go on as before.
    body = browser.find_element(By.TAG_NAME, "body")
    sockets = int(str(body.get_attribute("data-sockets")))
    browser.execute_script("window.lmserveAutocomplete.dropSocket();")
    _wait(browser, "a new socket", lambda d: body.get_attribute("data-sockets") == str(sockets + 1))
    editor.send_keys(Keys.BACKSPACE, " ")
    assert _answered(browser) == next_words
    assert browser.find_element(By.ID, "session").text == session
    assert browser.find_element(By.ID, "context").text == "6 tokens"


def test_the_page_asks_for_a_token_when_the_server_needs_one(
    browser: webdriver.Chrome, auth_server: BackgroundServer
) -> None:
    server = auth_server  # the session's server that asks for AUTH_TOKEN
    browser.get(f"http://127.0.0.1:{server.http_port}/")
    field = browser.find_element(By.ID, "token")
    _wait(browser, "the token field is shown", lambda d: field.is_displayed())
    assert "token" in browser.find_element(By.ID, "status").text
    field.send_keys(TOKEN, Keys.ENTER)
    _connected(browser)
    editor = browser.find_element(By.ID, "editor")
    editor.click()
    editor.send_keys("and god s")
    assert all(w.startswith("s") for w in _answered(browser))
