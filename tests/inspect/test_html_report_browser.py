"""`precompile report`'s page in a real headless browser (Debian's `chromium`; .ci/run installs it).

Loads a two-artifact report (one of them hostile: markup in its python_code) from disk with the
network off, and checks that the page loads with no console error, that every section is in the
DOM the browser built, that the hostile markup is text (no element came of it), and writes a
screenshot whose path the test prints.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from test_html_report import HOSTILE, SECTIONS, hostile_pair
from test_inspect_helpers import ROOT, run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not on PATH: install Debian's chromium package (apt-get install -y chromium; .ci/run does) to run the browser test",
)


def _chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
        "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'chromium-profile'}", *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line or "Refused to" in line]


def test_the_report_loads_in_chromium_with_its_sections_and_hostile_text_inert(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    html = tmp_path / "report.html"
    rc, _, err = run_cli(capsys, ["report", str(hostile_pair(tmp_path)), "fixtures/v1/mlp_inductor", "-o", str(html)])
    assert rc == 1, err  # the hostile copy does not pair, and the two differ
    url = html.as_uri()

    dumped = _chromium(tmp_path, "--dump-dom", url)
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    dom = dumped.stdout
    assert not _console_errors(dumped.stderr), _console_errors(dumped.stderr)
    assert "<h1>precompile report</h1>" in dom and 'id="toc"' in dom
    for page in ("artifact-a", "artifact-b"):
        for section in SECTIONS:
            assert f'id="{page}-{section}"' in dom
    assert 'id="diff-entries"' in dom and 'id="diff-code"' in dom
    # The browser parsed the hostile markup as text: no script or img element exists, and the text is there.
    assert "<script" not in dom.lower() and "<img" not in dom.lower()
    assert HOSTILE.replace("<", "&lt;").replace(">", "&gt;") in dom
    # Every section is still inside <main>: the hostile "</pre>" closed nothing.
    main = dom[dom.index("<main>"):dom.index("</main>")]
    assert all(f'id="{page}-code"' in main for page in ("artifact-a", "artifact-b")) and 'id="diff"' in main

    screenshot = tmp_path / "report.png"
    shot = _chromium(tmp_path, f"--screenshot={screenshot}", "--window-size=1280,2000", url)
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000, shot.stderr[-2000:]
    assert not _console_errors(shot.stderr), _console_errors(shot.stderr)
    with capsys.disabled():
        print(f"\nscreenshot of the report: {screenshot}")
    assert re.match(rb"\x89PNG", screenshot.read_bytes()[:4])
