"""`slick inspect` in a real headless Chromium (the system's `chromium` package), driven over the DevTools
protocol: the page renders its charts, a sample's tokens are shown coloured by loss mask and by logprob, and the
console stays free of errors. CI sets SLICK_REQUIRE_BROWSER=1 (.ci/run), so a missing Chromium fails there.

SLICK_INSPECT_SCREENSHOT=PATH also writes the page's screenshot to PATH (docs/img/inspect.png was made so)."""
import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.rollout_data import make_run
from tests.test_inspect import inspector

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--remote-debugging-port=0", "--window-size=1280,2000"]


def chromium_binary():
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found:
        return found
    if os.environ.get("SLICK_REQUIRE_BROWSER") == "1":
        pytest.fail("SLICK_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install chromium chromium-driver)")
    pytest.skip("no chromium on PATH (CI installs it and sets SLICK_REQUIRE_BROWSER=1)")


class Browser:
    """A headless Chromium in its own process group with a fresh profile; DevTools over a websocket."""

    def __init__(self, binary, profile: Path):
        self.profile = profile
        self.proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self.events, self._id, self.ws, self.session = [], 0, None, None

    def port(self, timeout=60.0) -> int:
        marker, deadline = self.profile / "DevToolsActivePort", time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker.is_file() and marker.read_text().strip():
                return int(marker.read_text().split()[0])
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}: {self.proc.stderr.read()[-2000:]!r}")
            time.sleep(0.1)
        raise TimeoutError(f"chromium wrote no {marker} within {timeout}s")

    async def connect(self):
        import aiohttp

        port = self.port()
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list",
                                    timeout=aiohttp.ClientTimeout(total=30)) as r:
            pages = [t for t in await r.json() if t["type"] == "page"]
        if not pages:
            async with self.session.put(f"http://127.0.0.1:{port}/json/new?about:blank") as r:
                pages = [await r.json()]
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)

    async def send(self, method, timeout=30.0, **params):
        self._id += 1
        await self.ws.send_json({"id": self._id, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no DevTools reply to {method} within {timeout}s")
            msg = json.loads((await self.ws.receive(timeout=left)).data)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            self.events.append(msg)

    async def eval(self, expr):
        res = await self.send("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"{expr}: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def wait_for(self, expr, what, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.eval(expr):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"the page did not show {what} within {timeout}s ({expr})")

    def errors(self):
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(p["exceptionDetails"].get("text", "") + " " +
                           str(p["exceptionDetails"].get("exception", {}).get("description", "")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", "") + " " + p["entry"].get("url", ""))
        return out

    async def close(self):
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=20)
        self.proc.stderr.close()


async def drive(binary, profile, url):
    b = Browser(binary, profile)
    try:
        await b.connect()
        for domain in ("Runtime", "Log", "Page"):
            await b.send(f"{domain}.enable")
        await b.send("Emulation.setDeviceMetricsOverride", width=1280, height=2000, deviceScaleFactor=1, mobile=False)
        await b.send("Page.navigate", url=url + "/")
        await b.wait_for("document.body && document.body.dataset.ready === '1'", "its first data")
        got = {"title": await b.eval("document.getElementById('run-name').textContent"),
               "curves": await b.eval("document.querySelectorAll('#curves svg polyline').length"),
               "dist_charts": await b.eval("document.querySelectorAll('#dists svg').length"),
               "best": await b.eval("[...document.querySelectorAll('#best .card')].map(c => +c.dataset.index)"),
               "worst": await b.eval("[...document.querySelectorAll('#worst .card')].map(c => +c.dataset.index)")}
        await b.eval("document.querySelector('#best .card[data-index=\"37\"]').click()")
        await b.wait_for("document.querySelectorAll('#tokens .tok').length > 0", "the sample's tokens")
        got["tokens"] = await b.eval("[...document.querySelectorAll('#tokens .tok')].map(t => t.textContent).join('')")
        got["masks"] = await b.eval("[...document.querySelectorAll('#tokens .tok')].map(t => +t.dataset.mask)")
        got["tool_bg"] = await b.eval("getComputedStyle(document.querySelector('#tokens .tok.tool')).backgroundColor")
        got["train_bg"] = await b.eval("getComputedStyle(document.querySelector('#tokens .tok.train')).backgroundColor")
        got["title"] = await b.eval("document.getElementById('sample-title').textContent")
        shot = (await b.send("Page.captureScreenshot", format="png"))["data"]
        await b.eval("document.querySelector('input[value=logprob]').click()")
        got["logprob_bgs"] = await b.eval("[...document.querySelectorAll('#tokens .tok')].map(t => t.style.background)")
        await asyncio.sleep(0.5)                        # late errors (a refresh tick is 5 s away; none is due)
        await b.send("Runtime.evaluate", expression="1")
        got["errors"] = b.errors()
        return got, base64.b64decode(shot)
    finally:
        await b.close()


@pytest.mark.slow
def test_page_renders_tokens_without_console_errors(tmp_path):
    binary = chromium_binary()
    run = tmp_path / "run"
    run.mkdir()
    make_run(run, steps=(1, 2, 3, 4, 5))
    with inspector(run) as url:
        got, png = asyncio.run(drive(binary, tmp_path / "profile", url))
    assert got["errors"] == []
    assert got["curves"] >= 4                             # reward, length, loss, staleness curves
    assert got["dist_charts"] == 5                        # reward band, length, staleness, two histograms
    assert got["best"] == [32, 33, 34, 36, 37] and got["worst"] == [35, 39, 32, 33, 34]
    assert got["title"] == "#37 of step 5"
    assert got["tokens"] == "the answer is 21"            # 5 + 15 + 1: paid by the lenient verifier
    assert got["masks"][:6] == [1, 1, 0, 0, 0, 1]
    assert got["tool_bg"] != got["train_bg"]              # tool tokens look different
    assert len(set(got["logprob_bgs"])) > 1 and all(bg.startswith("rgba(239, 68, 68") for bg in got["logprob_bgs"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    if os.environ.get("SLICK_INSPECT_SCREENSHOT"):
        Path(os.environ["SLICK_INSPECT_SCREENSHOT"]).write_bytes(png)
