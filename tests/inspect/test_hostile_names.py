"""A name a hostile store lists reaches every renderer escaped: a plain HTTP server on the loopback
whose directory listing names the pair with a right-to-left override, a line break's look-alikes
and a terminal escape in it, raw (an honest server percent-encodes them). Whatever the verb and the
format, the output holds the escape (`\\u202e`), never the character (terminal_text.printable)."""
from __future__ import annotations

import functools
import html
import http.server
import io
import json
import os
import shutil
import threading
import xml.etree.ElementTree as ET

import pytest

from test_inspect_helpers import ROOT, run_cli

HOSTILE = "m\u202eyp\u2066\u200f\x1b[2J\u2028x"
"""A pair's stem: a bidi override, an isolate, a mark, a terminal escape and a line separator."""
RAW = ("\u202e", "\u2066", "\u200f", "\x1b", "\u2028")


class _HostileListing(http.server.SimpleHTTPRequestHandler):
    """Serves files as they are; lists a directory's names raw in its links, as a hostile store may."""

    def list_directory(self, path):
        body = "".join(f'<a href="{name}">{name}</a>\n' for name in sorted(os.listdir(path))).encode("utf-8")
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory):
    """The URL of a directory holding fixtures/v1/mlp under the hostile stem."""
    pytest.importorskip("fsspec")
    pytest.importorskip("aiohttp")
    root = tmp_path_factory.mktemp("hostile-store")
    (root / "dir").mkdir()
    for suffix in (".py", ".cache"):
        shutil.copyfile(ROOT / f"fixtures/v1/mlp{suffix}", root / "dir" / f"{HOSTILE}{suffix}")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_HostileListing, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/dir"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PRECOMPILE_FETCH_CACHE", str(tmp_path / "fetch"))


def _escaped(text: str) -> None:
    assert not [char for char in RAW if char in text], text
    assert "m\\u202eyp\\u2066\\u200f\\x1b[2J\\u2028x" in text


@pytest.mark.parametrize("output", [["--format", "markdown"], [], ["--json"]])
def test_diff_writes_a_hostile_listed_name_escaped_in_every_format(capsys, tmp_path, hostile_store, output):
    junit = tmp_path / "diff.xml"
    rc, out, err = run_cli(capsys, ["diff", *output, "--junit", str(junit), hostile_store, "fixtures/v1/mlp_b4"])
    assert rc == 1, err
    if output == ["--json"]:  # data: the name as listed, every character of it written as a JSON escape
        assert not [char for char in RAW if char in out] and json.loads(out)["a"] == f"{hostile_store}/{HOSTILE}.py"
    else:
        _escaped(out)
    properties = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    _escaped(properties["a"])
    assert not [char for char in RAW if char in junit.read_text(encoding="utf-8")]


@pytest.mark.parametrize("verb", [["show"], ["verify"], ["guards"]])
def test_show_verify_and_guards_write_it_escaped(capsys, hostile_store, verb):
    rc, out, err = run_cli(capsys, [*verb, hostile_store])
    _escaped(out)
    assert not [char for char in RAW if char in err]


def test_the_report_page_writes_it_escaped(capsys, tmp_path, hostile_store):
    page = tmp_path / "r.html"
    rc, _, err = run_cli(capsys, ["report", hostile_store, "fixtures/v1/mlp_b4", "-o", str(page)])
    assert rc == 1, err
    text = page.read_text(encoding="utf-8")
    _escaped(html.unescape(text))
