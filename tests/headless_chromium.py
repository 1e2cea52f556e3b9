"""Load a local page in headless Chromium and report what a reader's browser would see: console
messages, uncaught exceptions, browser log entries (failed loads and the like), every request
made, whether each image decoded, and a full-page screenshot.

It speaks the DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated JSON on file
descriptors 3 and 4 of the browser), so it needs no Python package beyond the standard library.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BINARIES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

# Resolves to one entry per image once every image has settled: decode() rejects for an image
# that failed to load or cannot be decoded.
_IMAGES_JS = """Promise.all([...document.images].map(img => img.decode().then(
    () => ({alt: img.alt, ok: img.complete && img.naturalWidth > 0, width: img.naturalWidth}),
    () => ({alt: img.alt, ok: false, width: img.naturalWidth}))))"""


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) binary on PATH, or None."""
    for name in BINARIES:
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageReport:
    """What loading one page produced.

    console:    console API calls: {"type": "log" | "warning" | "error" | ..., "text"}.
    exceptions: uncaught exceptions' descriptions.
    log:        browser log entries: {"level", "source", "text", "url"} (e.g. a failed request).
    requests:   URLs of every request the page made (the page itself included).
    images:     per <img>: {"alt", "ok" (decoded, non-zero size), "width"}.
    screenshot: the whole page as PNG bytes, ``width`` CSS pixels wide.
    title:      document.title after load.
    probes:     the value of each JavaScript expression asked for, after load.
    """

    console: list[dict[str, str]] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log: list[dict[str, str]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    images: list[dict[str, Any]] = field(default_factory=list)
    screenshot: bytes = b""
    title: str = ""
    probes: dict[str, Any] = field(default_factory=dict)

    def errors(self) -> list[str]:
        """Everything a reader's console would show as an error."""
        return ([f"console.{c['type']}: {c['text']}" for c in self.console if c["type"] in ("error", "assert")]
                + [f"exception: {e}" for e in self.exceptions]
                + [f"log {e['source']}: {e['text']} {e.get('url', '')}" for e in self.log if e["level"] == "error"])


class _Pipe:
    """DevTools protocol messages over the browser's pipe: ``call`` waits for its reply and
    keeps the events that arrive meanwhile."""

    def __init__(self, to_browser: int, from_browser: int, timeout: float) -> None:
        self.w, self.r, self.deadline = to_browser, from_browser, time.monotonic() + timeout
        self.buf, self.next_id, self.events = b"", 0, []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        want = self.send(method, params, session)
        while True:
            msg = self._read()
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_for(self, method: str) -> dict[str, Any]:
        for i, ev in enumerate(self.events):
            if ev["method"] == method:
                return self.events.pop(i)
        while True:
            msg = self._read()
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)


def load_page(chromium: str, page: Path, *, probes: dict[str, str] | None = None, width: int = 1280,
              height: int = 900, timeout: float = 60, full_page: bool = True,
              between: tuple[str, str] | None = None) -> PageReport:
    """Open ``page`` (a local file) in a fresh headless ``chromium`` profile and report on it;
    ``probes``: name -> a JavaScript expression evaluated in the loaded page (JSON-able value);
    ``full_page``: screenshot the whole page, else only what the ``width`` x ``height`` window shows;
    ``between``: (CSS selector, CSS selector): screenshot from the top of the first element to the
    bottom of the second instead, ``width`` wide."""
    to_r, to_w = os.pipe()      # we write commands; the browser reads them on fd 3
    from_r, from_w = os.pipe()  # the browser writes replies on fd 4

    def child_fds() -> None:  # in the child, before exec: the pipe ends to fds 3 and 4
        a, b = os.dup(to_r), os.dup(from_w)  # copies first, so a dup2 never overwrites the other end
        os.dup2(a, 3)
        os.dup2(b, 4)

    with tempfile.TemporaryDirectory(prefix="mlmt-chromium-") as profile:
        proc = subprocess.Popen(
            [chromium, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
             f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=child_fds, close_fds=False)  # close_fds would close 3 and 4 after preexec_fn
        os.close(to_r)
        os.close(from_w)
        cdp = _Pipe(to_w, from_r, timeout)
        try:
            return _inspect(cdp, page, probes or {}, width, height, full_page, between)
        finally:
            try:
                cdp.send("Browser.close")
            except OSError:
                pass
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            os.close(to_w)
            os.close(from_r)
            proc.stderr.close()


def _inspect(cdp: _Pipe, page: Path, probes: dict[str, str], width: int, height: int,
             full_page: bool = True, between: tuple[str, str] | None = None) -> PageReport:
    target = cdp.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    s = cdp.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Runtime", "Log", "Page", "Network"):
        cdp.call(f"{domain}.enable", session=s)
    cdp.call("Emulation.setDeviceMetricsOverride",
             {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=s)
    cdp.call("Page.navigate", {"url": page.resolve().as_uri()}, session=s)
    cdp.wait_for("Page.loadEventFired")

    def evaluate(expression: str) -> Any:
        res = cdp.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True},
                       session=s)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expression!r} raised {res['exceptionDetails']}")
        return res["result"].get("value")

    images, title = evaluate(_IMAGES_JS), evaluate("document.title")
    values = {name: evaluate(expr) for name, expr in probes.items()}
    size = cdp.call("Page.getLayoutMetrics", session=s)["cssContentSize"]
    top, shot_height = 0, max(height, size["height"]) if full_page else height
    if between is not None:
        edge = "document.querySelector({}).getBoundingClientRect().{} + window.scrollY"
        top = int(evaluate(edge.format(json.dumps(between[0]), "top"))) - 8
        shot_height = int(evaluate(edge.format(json.dumps(between[1]), "bottom"))) + 8 - top
    shot = cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                               "clip": {"x": 0, "y": top, "width": width, "height": shot_height,
                                                        "scale": 1}},
                    session=s)
    report = PageReport(images=images, title=title, probes=values, screenshot=base64.b64decode(shot["data"]))
    for ev in cdp.events:
        p = ev.get("params", {})
        if ev["method"] == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            report.console.append({"type": p.get("type", ""), "text": text})
        elif ev["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            report.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))
        elif ev["method"] == "Log.entryAdded":
            e = p.get("entry", {})
            report.log.append({k: str(e.get(k, "")) for k in ("level", "source", "text", "url")})
        elif ev["method"] == "Network.requestWillBeSent":
            report.requests.append(p.get("request", {}).get("url", ""))
    return report


if __name__ == "__main__":  # what the README's screenshots were taken with (docs/screenshots/README.md)
    import argparse

    parser = argparse.ArgumentParser(description="Screenshot a local page in headless Chromium: its first "
                                                 "screen, or from one element to another (--between).")
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=900)
    parser.add_argument("--between", nargs=2, metavar=("FROM", "TO"), help="CSS selectors")
    args = parser.parse_args()
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("error: no Chromium or Chrome on PATH")
    shot = load_page(chromium, args.page, width=args.width, height=args.height, full_page=False,
                     between=tuple(args.between) if args.between else None)
    if shot.errors():
        raise SystemExit(f"error: the page reported {shot.errors()}")
    args.out.write_bytes(shot.screenshot)
