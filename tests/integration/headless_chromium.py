"""One headless Chromium for the browser tests: Debian's chromium and chromium-driver, as CI
installs them, with a fixed window, scale and colour profile so pages render the same anywhere."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARGUMENTS = (
    "--headless=new",
    "--no-sandbox",  # CI runs as root
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--window-size=1200,760",
    "--force-device-scale-factor=1",
    "--force-color-profile=srgb",
    "--lang=en-US",
)


@contextmanager
def headless_chromium() -> Iterator[webdriver.Chrome]:
    """A driven browser, quit on exit; fails (never skips) with the install line when absent."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: apt-get install -y chromium chromium-driver "
            "(.ci/run installs them)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ARGUMENTS:
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
