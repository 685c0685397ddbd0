"""Credentials in a URL (its userinfo, a signed URL's query secrets) are used to fetch, and never printed:
not by show (text or --json), verify, diff (text, markdown, --junit), report's HTML page, nor an error."""
from __future__ import annotations

import base64
import functools
import http.server
import threading
from pathlib import Path

import pytest
from test_inspect_helpers import FIXTURES, run_cli

from precompile.storage.locations import redacted

TOKEN, SECRET = "TOKEN-b6f1e2", "SECRET-9c3d7a"


class _AuthHandler(http.server.SimpleHTTPRequestHandler):
    """Serves only a request carrying user:TOKEN (HTTP basic authentication), as a private store would."""

    def do_HEAD(self) -> None:
        if self._allowed():
            super().do_HEAD()

    def do_GET(self) -> None:
        if self._allowed():
            super().do_GET()

    def _allowed(self) -> bool:
        if self.headers.get("Authorization") == "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode():
            return True
        self.send_error(401)
        return False

    def log_message(self, format, *args) -> None:
        pass


@pytest.fixture
def private_store(tmp_path, monkeypatch):
    """The URL of a directory holding mlp.py and mlp.cache, behind user:TOKEN."""
    monkeypatch.setenv("PRECOMPILE_FETCH_CACHE", str(tmp_path / "fetch"))
    served = tmp_path / "served"
    served.mkdir()
    for suffix in (".py", ".cache"):
        (served / f"mlp{suffix}").write_bytes((FIXTURES / "v1" / f"mlp{suffix}").read_bytes())
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_AuthHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://user:{TOKEN}@127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _clean(*texts: str) -> None:
    for text in texts:
        assert TOKEN not in text and SECRET not in text, text


def test_the_verbs_read_a_url_with_credentials_and_never_print_them(private_store, capsys, tmp_path):
    shown = private_store.replace(f"user:{TOKEN}@", "***@")
    rc, out, err = run_cli(capsys, ["show", f"{private_store}/mlp.py"])
    assert rc == 0, err
    assert f"{shown}/mlp.py" in out  # the read worked, and names the URL without its password
    _clean(out, err)
    rc, out, err = run_cli(capsys, ["show", "--json", f"{private_store}/mlp"])
    assert rc == 0 and f"{shown}/mlp.py" in out, err
    _clean(out, err)
    rc, out, err = run_cli(capsys, ["verify", f"{private_store}/mlp.py", f"{private_store}/mlp.cache"])
    assert rc == 0, err
    _clean(out, err)
    junit = tmp_path / "diff.xml"
    for output in ("text", "markdown"):
        rc, out, err = run_cli(capsys, ["diff", "--format", output, "--junit", str(junit), f"{private_store}/mlp",
                                        str(FIXTURES / "v1" / "mlp")])
        assert rc == 0, err
        _clean(out, err, junit.read_text(encoding="utf-8"))
    page = tmp_path / "report.html"
    rc, out, err = run_cli(capsys, ["report", f"{private_store}/mlp", "-o", str(page)])
    html = page.read_text(encoding="utf-8")
    assert rc == 0 and f"{shown}/mlp.py" in html, err
    _clean(out, err, html)


def test_an_error_names_a_url_without_its_credentials(private_store, capsys):
    for argv in (["show", f"{private_store}/missing.py"], ["show", "--json", f"{private_store}/missing.py"],
                 ["verify", f"{private_store}/mlp.py", f"{private_store}/missing.cache"],
                 ["show", f"{private_store}/mlp.py?X-Amz-Signature={SECRET}&X-Amz-Expires=60"]):
        rc, out, err = run_cli(capsys, argv)
        assert rc == 2 and "127.0.0.1" in err, err
        _clean(out, err)


@pytest.mark.parametrize(("url", "expected"), [
    ("https://user:pa%40ss@host/a/b.py", "https://***@host/a/b.py"),
    ("s3://bucket/key.py", "s3://bucket/key.py"),
    ("https://h/o.py?X-Amz-Algorithm=AWS4&X-Amz-Credential=AKIA%2F1&X-Amz-Signature=ab12&X-Amz-Security-Token=t",
     "https://h/o.py?X-Amz-Algorithm=AWS4&X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Security-Token=***"),
    ("https://s.blob.core.windows.net/c/o.py?sv=2022&sp=r&sig=abc%3D#frag", "https://s.blob.core.windows.net/c/o.py?sv=2022&sp=r&sig=***#frag"),
    ("gs://b/o?X-Goog-Signature=1&x-goog-credential=2&token=3&access_token=4&key=5&Password=6&secret=7&signature=8&keep=9",
     "gs://b/o?X-Goog-Signature=***&x-goog-credential=***&token=***&access_token=***&key=***&Password=***&secret=***"
     "&signature=***&keep=9"),
    ("could not read cache http://u:p@h:1/x.cache: 401, url='http://u:p@h:1/x.cache?sig=s'",
     "could not read cache http://***@h:1/x.cache: 401, url='http://***@h:1/x.cache?sig=***'"),
    ("a user@example.com and /local/path?token=x stay", "a user@example.com and /local/path?token=x stay"),
])
def test_redacted_hides_userinfo_and_query_secrets_and_keeps_the_rest(url, expected):
    assert redacted(url) == expected


def test_the_docs_say_so():
    assert "redact" in (Path(__file__).resolve().parents[2] / "docs" / "remote.md").read_text(encoding="utf-8")
