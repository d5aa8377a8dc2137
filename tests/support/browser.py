"""A real headless browser for tests: Debian's Chromium driven by Selenium through Debian's
chromium-driver (installed by `scripts/install.sh --test`).

Selenium over the packaged driver rather than Playwright: the driver is built from the same
Chromium source as the browser (one Debian version for both, so they never disagree about
the protocol), the Python client is pure Python, and nothing is downloaded at run time
(Playwright's own Chromium builds cannot be fetched here; Selenium Manager is never asked,
since both paths are given). Every network request the page makes is read back from
Chromium's performance log, so a test can show that none left the machine.
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import refuse_in_fast_tests

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# Headless as root, and quiet: no first-run pages, no background calls home (updates,
# component downloads, sync, QUIC probes) that would show up as requests leaving the machine.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)
# A microphone for getUserMedia without a person or a sound card: Chromium's fake capture
# device (a tone with a beep a second) and its permission prompt answered yes.
FAKE_MICROPHONE = ("--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream")
WAIT = 30.0  # seconds a test waits for the page to show something
# The type a pasted or dropped file carries, by its name's extension (none for others, as a
# browser gives a file it has no type for).
FILE_TYPES = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "webm": "video/webm",
    "mp4": "video/mp4",
    "txt": "text/plain",
}


def require_chromium() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} missing: the browser tests need Debian's chromium and "
            "chromium-driver (scripts/install.sh --test installs them)"
        )


class Browser:
    """One headless Chromium with a fresh profile; `requests()` lists the URLs the page asked
    for since the last call."""

    def __init__(self, width: int = 1200, height: int = 1200, flags: tuple[str, ...] = ()) -> None:
        """`flags`: Chromium's, over FLAGS (e.g. FAKE_MICROPHONE)."""
        refuse_in_fast_tests("a headless Chromium")
        require_chromium()
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="mmgate-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        sized = (f"--user-data-dir={self.profile}", f"--window-size={width},{height}")
        for flag in (*FLAGS, *flags, *sized):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.version = self.driver.capabilities["browserVersion"]

    def quit(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)

    def requests(self) -> list[str]:
        """Every URL the browser requested since the last call (documents, scripts, fetches,
        images, including blocked ones)."""
        urls = []
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message["method"] == "Network.requestWillBeSent":
                urls.append(message["params"]["request"]["url"])
        return urls

    def console_errors(self) -> list[str]:
        """The console's error lines since the last call (a CSP violation is one)."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def wait(self, condition: Callable[[Any], Any], timeout: float = WAIT, what: str = "") -> Any:
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout, poll_frequency=0.05).until(
            condition, message=what
        )

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def dispatch_files(self, event: str, target_css: str, files: dict[str, bytes]) -> None:
        """Fires a `paste` or `drop` event carrying `files` at the element, as a person
        pasting or dropping them would (headless Chromium has no system clipboard or drag
        source; the page's handlers see the same DataTransfer)."""
        encoded = {name: base64.b64encode(data).decode() for name, data in files.items()}
        self.js(
            """
            const [kind, css, files, types] = arguments;
            const data = new DataTransfer();
            for (const [name, b64] of Object.entries(files)) {
              const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
              const type = types[name.split('.').pop()] || '';
              data.items.add(new File([bytes], name, { type }));
            }
            const init = { bubbles: true, cancelable: true };
            const target = document.querySelector(css);
            if (kind === 'paste') {
              target.dispatchEvent(new ClipboardEvent('paste', { ...init, clipboardData: data }));
            } else {
              target.dispatchEvent(new DragEvent('dragover', { ...init, dataTransfer: data }));
              target.dispatchEvent(new DragEvent('drop', { ...init, dataTransfer: data }));
            }
            """,
            event,
            target_css,
            encoded,
            FILE_TYPES,
        )
