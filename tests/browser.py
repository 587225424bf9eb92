"""Open an HTML page in headless Chromium (Debian's `chromium`), with the network cut off: the DOM after its
scripts ran, a screenshot, and the errors the page raised.

Console errors are recorded by a hook injected at the top of a copy of the page (console.error, uncaught
exceptions, unhandled promise rejections are written into a <pre id="prism-console-errors">, which
--dump-dom shows); Chromium's own console log (--enable-logging=stderr) is scanned for "Uncaught" too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # no network: a page that needs one fails here
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]

HOOK = """<script>(function(){
  var errors = [];
  function keep(text){ errors.push(String(text)); var pre = document.getElementById('prism-console-errors');
    if (!pre && document.body) { pre = document.createElement('pre'); pre.id = 'prism-console-errors';
      document.body.appendChild(pre); }
    if (pre) pre.textContent = errors.join('\\n'); }
  var original = console.error;
  console.error = function(){ keep(Array.prototype.join.call(arguments, ' ')); original.apply(console, arguments); };
  window.addEventListener('error', function(e){ keep('uncaught: ' + e.message); });
  window.addEventListener('unhandledrejection', function(e){ keep('unhandled rejection: ' + e.reason); });
  document.addEventListener('DOMContentLoaded', function(){ if (errors.length) keep(errors.pop()); });
})();</script>"""


@dataclass
class PageResult:
    dom: str
    errors: list[str]
    screenshot: Path


def chromium() -> str | None:
    """The chromium binary; skips the test when missing, unless PRISM_REQUIRE_BROWSER=1 (CI) fails it."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("PRISM_REQUIRE_BROWSER") == "1":
        pytest.fail("chromium is not installed but PRISM_REQUIRE_BROWSER=1: apt-get install -y chromium")
    pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return None


def open_page(page: Path, workdir: Path, width: int = 1400, height: int = 5000) -> PageResult:
    """Load `page` (a copy with the error hook) and return its DOM, errors and a screenshot."""
    binary = chromium()
    text = page.read_text(encoding="utf-8")
    hooked = workdir / "hooked.html"
    hooked.write_text(re.sub(r"<head>", lambda m: "<head>" + HOOK, text, count=1), encoding="utf-8")
    shot = workdir / "screenshot.png"
    common = [binary, *FLAGS, f"--user-data-dir={workdir / 'profile'}", f"--window-size={width},{height}"]
    dom = subprocess.run([*common, "--dump-dom", hooked.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shoot = subprocess.run([*common, f"--screenshot={shot}", hooked.as_uri()], capture_output=True, text=True,
                           timeout=120)
    assert shoot.returncode == 0 and shot.is_file(), shoot.stderr[-2000:]
    errors = []
    match = re.search(r'<pre id="prism-console-errors">(.*?)</pre>', dom.stdout, re.S)
    if match and match.group(1).strip():
        errors += match.group(1).strip().splitlines()
    for stderr in (dom.stderr, shoot.stderr):
        errors += [line for line in stderr.splitlines() if "CONSOLE" in line and "Uncaught" in line]
    return PageResult(dom.stdout, errors, shot)


class _Sources(HTMLParser):
    def __init__(self):
        super().__init__()
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href") and value and not value.startswith(("#", "data:", "javascript:")):
                self.external.append(f"<{tag} {name}={value}>")


def external_resources(text: str) -> list[str]:
    """The tags of a page that load something (script src, link href, img src): a self-contained page has none."""
    parser = _Sources()
    parser.feed(text)
    return parser.external


def plots_without_data(dom: str) -> tuple[int, list[str]]:
    """(number of plotly plots, ids of those that drew no bar, point or line)."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r'<div id="([^"]+)" class="plotly-graph-div', dom)]
    empty = []
    for i, (at, div_id) in enumerate(starts):
        chunk = dom[at: starts[i + 1][0] if i + 1 < len(starts) else len(dom)]
        drawn = len(re.findall(r'class="point"|class="js-line"', chunk))
        if "main-svg" not in chunk or drawn == 0:
            empty.append(div_id)
    return len(starts), empty
