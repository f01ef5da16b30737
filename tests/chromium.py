"""Headless Chromium (Debian's ``chromium`` package) driven over the DevTools protocol with the
``websockets`` package: open a page, evaluate JavaScript in it, take screenshots.

The browser may talk to 127.0.0.1 only: every other host resolves to nothing and goes to a
dead proxy, and its background services (updates, sync, safe browsing) are off.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import orjson
from websockets.sync.client import connect

_FLAGS = [
    "--headless=new",
    "--no-sandbox",  # root in CI containers
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication",
    "--no-pings",
    "--mute-audio",
    "--hide-scrollbars",
    "--proxy-server=http://127.0.0.1:9",  # loopback bypasses it; nothing else gets out
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    "--remote-debugging-port=0",
]


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class CdpError(RuntimeError):
    pass


class Browser:
    def __init__(self, width: int = 1440, height: int = 1000, timeout_s: float = 60) -> None:
        binary = chromium_binary()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="omni-chromium-"))
        self.log_path = self.profile.parent / (self.profile.name + ".log")
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [binary, *_FLAGS, f"--user-data-dir={self.profile}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the browser's helpers die with its group
        )  # fmt: skip
        # Chromium writes the port it picked and the browser target's path here.
        active = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (active.exists() and len(active.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise CdpError(f"chromium did not start:\n{self.log()}")
            time.sleep(0.1)
        port, path = active.read_text().splitlines()[:2]
        # as a context manager, the form every websockets version supports without warnings
        url = f"ws://127.0.0.1:{port}{path}"
        options = {"max_size": None, "open_timeout": timeout_s, "ping_interval": None}
        try:
            self._ws_cm = connect(url, proxy=None, **options)  # never through a proxy
        except TypeError:  # websockets < 15 knows no proxies
            self._ws_cm = connect(url, **options)
        self.ws = self._ws_cm.__enter__()
        self._ids = itertools.count(1)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-4000:]
        return ""

    def send(
        self, method: str, params: dict | None = None, session: str | None = None, timeout=30.0
    ) -> dict:
        msg_id = next(self._ids)
        msg: dict = {"id": msg_id, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        self.ws.send(orjson.dumps(msg).decode())
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError(f"{method}: no answer in {timeout}s")
            reply = orjson.loads(self.ws.recv(timeout=left))
            if reply.get("id") != msg_id:
                continue  # an event
            if "error" in reply:
                raise CdpError(f"{method}: {reply['error']}")
            return reply["result"]

    def open(self, url: str) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        page = Page(self, session)
        page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        page.send("Page.enable")
        page.send("Page.navigate", {"url": url})
        return page

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._ws_cm.__exit__(None, None, None)
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # helpers that outlived the browser
        self._log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)


class Page:
    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    def send(self, method: str, params: dict | None = None, timeout: float = 30.0) -> dict:
        return self.browser.send(method, params, self.session, timeout)

    def eval(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise CdpError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0, interval: float = 0.2) -> object:
        """Poll a JavaScript expression until it is truthy; fail with its last value."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            with contextlib.suppress(CdpError):
                last = self.eval(expression)
                if last:
                    return last
            time.sleep(interval)
        raise TimeoutError(f"{expression!r} not true in {timeout}s (last: {last!r})")

    def text(self, selector: str = "body") -> str:
        """What a person sees in an element (``innerText``)."""
        return str(
            self.eval(f"(document.querySelector({orjson.dumps(selector).decode()}) || {{}})"
                      ".innerText || ''")
        )  # fmt: skip

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict = {"format": "png"}
        if full_page:
            height = int(self.eval("document.documentElement.scrollHeight") or 0)
            params["clip"] = {
                "x": 0, "y": 0, "width": self.browser.width,
                "height": max(height, 200), "scale": 1,
            }  # fmt: skip
            params["captureBeyondViewport"] = True
        data = self.send("Page.captureScreenshot", params)["data"]
        path.write_bytes(base64.b64decode(data))
        return path
