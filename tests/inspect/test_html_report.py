"""`precompile report`: the self-contained HTML page, its exit codes, --json, determinism and escaping.

Built from the committed fixture pairs only (nothing is captured or compiled). The page is checked
in a real browser by tests/inspect/test_html_report_browser.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from precompile.inspect.render.highlight import highlight_lines
from precompile.inspect.render.html_report import side_by_side
from test_inspect_helpers import ALL, FIXTURES, ROOT, run_cli

HOSTILE = "</pre><script>alert(1)</script><img src=x onerror=alert(2)>"
SECTIONS = ("summary", "frames", "guards", "kernels", "code")


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def hostile_pair(tmp_path):
    """A copy of fixtures/v1/mlp whose python_code carries markup in a comment, a string literal
    (FN_NAME, shown in the summary) and a section title. The cache no longer pairs (its code hash
    is of the original), which is itself a finding."""
    shutil.copy(FIXTURES / "v1" / "mlp.cache", tmp_path / "m.cache")
    text = (FIXTURES / "v1" / "mlp.py").read_text(encoding="utf-8")
    text = text.replace("FN_NAME = '__main__.mlp_step'", f"FN_NAME = '{HOSTILE}'")
    text = text.replace("\nimport ", f"\n# {HOSTILE}\nimport ", 1)
    lines = text.splitlines(keepends=True)
    lines[11] = lines[11].rstrip("\n") + f" {HOSTILE}\n"  # the title line of the metadata section
    (tmp_path / "m.py").write_text("".join(lines), encoding="utf-8")
    return tmp_path / "m"


def _report(capsys, tmp_path, *paths, name="r.html", extra=()):
    output = tmp_path / name
    rc, out, err = run_cli(capsys, ["report", *paths, "-o", str(output), *extra])
    return rc, out, err, output.read_text(encoding="utf-8") if output.exists() else None


def test_one_artifact_page_has_every_section_and_is_self_contained(capsys, tmp_path):
    rc, out, err, html = _report(capsys, tmp_path, "fixtures/v1/mlp_inductor")
    assert rc == 0, err
    assert out.startswith(f"wrote {tmp_path / 'r.html'} (")
    for section in SECTIONS:
        assert f'id="artifact-a-{section}"' in html
    assert 'id="toc"' in html and "<details" in html
    assert "<script" not in html.lower() and "http://" not in html and "https://" not in html
    assert "default-src 'none'" in html  # nothing can be fetched or run even if escaping failed
    assert str(FIXTURES) not in html and str(tmp_path) not in html  # paths as given, never resolved
    assert 'class="p">#include' in html  # the bundle's C++ kernel sources, highlighted
    assert '<span class="k">def</span> <span class="f">' in html  # python_code, highlighted
    assert "kernel-source" in html and "requirements" in html


def test_the_page_is_deterministic(capsys, tmp_path):
    pages = [_report(capsys, tmp_path, "fixtures/v1/dynamo_lowered", "fixtures/v1/dynamo_break", name=f"{i}.html")[3] for i in (1, 2)]
    assert pages[0] == pages[1]
    assert not re.search(r"20\d\d-\d\d-\d\d", pages[0])  # no timestamps


def test_dynamo_guards_show_the_condition_that_runs(capsys, tmp_path):
    rc, _, err, html = _report(capsys, tmp_path, "fixtures/v1/dynamo_lowered")
    assert rc == 0, err
    assert "condition that runs" in html and "TENSOR_MATCH" in html
    assert "Tensor torch.float32 on cpu, size (3, 6), stride (6, 1), requires_grad=False" in html  # what each tensor guard checks
    assert "Compiled subgraphs (3)" in html and "graph_0_forward" in html  # and each output module, highlighted
    assert "policy_dropped" in html


def test_two_artifacts_add_their_diff_side_by_side_and_exit_1(capsys, tmp_path):
    rc, out, err, html = _report(capsys, tmp_path, "fixtures/v1/mlp", "fixtures/v1/mlp_b4")
    assert rc == 1, err
    assert "the artifacts differ" in out
    for page in ("artifact-a", "artifact-b"):
        assert all(f'id="{page}-{section}"' in html for section in SECTIONS)
    assert 'id="diff"' in html and 'id="diff-entries"' in html and 'id="diff-code"' in html
    assert '<table class="sbs">' in html and '<tr class="changed">' in html
    assert "tensor (8, 8) torch.float32 cpu" in html and "tensor (4, 8) torch.float32 cpu" in html


def test_a_pair_against_itself_is_equal_and_exits_0(capsys, tmp_path):
    rc, out, err, html = _report(capsys, tmp_path, "fixtures/v1/mlp.py", "fixtures/v1/mlp.cache", "fixtures/v1/mlp.py",
                                 "fixtures/v1/mlp.cache")
    assert rc == 0, err
    assert "the artifacts are equal" in out and "No differences." in html


def test_a_py_then_a_cache_is_one_pair(capsys, tmp_path):
    rc, _, err, html = _report(capsys, tmp_path, "fixtures/v1/mlp.py", "fixtures/v1/mlp.cache")
    assert rc == 0, err
    assert 'id="diff"' not in html and 'id="artifact-b"' not in html


def test_json_says_what_was_written(capsys, tmp_path):
    rc, out, err, html = _report(capsys, tmp_path, "fixtures/v1/mlp", "fixtures/v1/mlp_b4", extra=["--json"])
    report = json.loads(out)
    assert rc == 1 and report["verb"] == "report" and report["report_version"] == "1"
    assert report["output"] == str(tmp_path / "r.html") and report["equal"] is False
    assert report["size"] == len(html.encode("utf-8")) and report["sha256"] == hashlib.sha256(html.encode("utf-8")).hexdigest()
    assert all(f'id="{section}"' in html for section in report["sections"])
    import msgspec

    from precompile.inspect.model.report import Report

    assert msgspec.json.decode(out, type=Report).report_version == "1"  # the report obeys its own schema


def test_hostile_python_code_renders_as_text(capsys, tmp_path):
    rc, _, err, html = _report(capsys, tmp_path, str(hostile_pair(tmp_path)))
    assert rc == 1  # the edited python_code no longer pairs with its cache: a finding
    assert "does not pair" in err
    assert "<script" not in html.lower() and "<img" not in html.lower()
    escaped = "&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
    assert html.count(escaped) >= 3  # the comment, FN_NAME in the summary and the section, the section title


def test_flagged_pickle_is_a_finding(capsys, tmp_path):
    rc, _, err, html = _report(capsys, tmp_path, "fixtures/hostile/dynamo_os_system")
    assert rc == 1
    assert "os" in err and "finding:" in html


def test_unreadable_cache_is_trouble_but_the_page_is_written(capsys, tmp_path):
    rc, _, err, html = _report(capsys, tmp_path, "fixtures/damaged/truncated")
    assert rc == 2 and "precompile: error:" in err
    assert html is not None and "problem:" in html


def test_report_never_overwrites_an_input(capsys, tmp_path):
    shutil.copy(FIXTURES / "v1" / "mlp.py", tmp_path / "m.py")
    shutil.copy(FIXTURES / "v1" / "mlp.cache", tmp_path / "m.cache")
    before = (tmp_path / "m.cache").read_bytes()
    rc, _, err = run_cli(capsys, ["report", str(tmp_path / "m"), "-o", str(tmp_path / "m.cache")])
    assert rc == 2 and "refusing to overwrite" in err
    assert (tmp_path / "m.cache").read_bytes() == before


def test_report_is_torch_free(tmp_path):
    code = ("import sys; from precompile.cli.main import main; "
            "rc = main(['report', 'fixtures/v1/mlp_inductor', 'fixtures/v1/dynamo_lowered', '-o', sys.argv[1]]); "
            "print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r.html")], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert proc.stdout.splitlines()[-1] == "1 False", proc.stderr


def test_report_takes_one_or_two_artifacts(capsys, tmp_path):
    rc, _, err, _ = _report(capsys, tmp_path, "a", "b", "c")
    assert rc == 2 and "one artifact or two" in err


@pytest.mark.parametrize("name", ALL + tuple(f"upstream/{release}{name}" for release in ("", "torch-2.15/")
                                             for name in ("eager", "inductor", "train_step", "mega_cache.bin")))
def test_every_fixture_gets_a_page_or_a_clear_error(capsys, tmp_path, name):
    rc, _, err, html = _report(capsys, tmp_path, f"fixtures/{name}")
    assert "Traceback" not in err
    if name.startswith(("v1/", "upstream/")):  # upstream's Mega-Cache holds only torch's reviewed classes
        assert rc == 0 and not err, err
    else:
        assert rc in (1, 2) and "precompile: " in err
    if html is not None:
        assert "</html>" in html and "As <code>precompile show</code> prints it" in html
    else:
        assert rc == 2  # python_code could not be read at all: nothing to show


def test_side_by_side_pairs_removed_and_added_lines():
    lines = ("--- a/graph", "+++ b/graph", "@@ -3,4 +3,4 @@", " same", "-old 1", "-old 2", "+new 1", " tail", "+extra")
    rows = side_by_side(lines)
    assert [r["kind"] for r in rows] == ["hunk", "same", "changed", "removed", "same", "added"]
    assert rows[1] == {"kind": "same", "na": 3, "a": "same", "nb": 3, "b": "same"}
    assert (rows[2]["na"], rows[2]["a"], rows[2]["nb"], rows[2]["b"]) == (4, "old 1", 4, "new 1")
    assert (rows[3]["na"], rows[3]["b"]) == (5, "")
    assert (rows[4]["na"], rows[4]["nb"]) == (6, 5) and rows[5]["nb"] == 6
    # A removed line that itself starts with "--" is content, not a file header.
    assert side_by_side(("@@ -1 +1 @@", "--- x"))[1]["a"] == "-- x"


@pytest.mark.parametrize("language", ["python", "cpp", "text"])
def test_the_highlighter_escapes_everything_and_keeps_lines(language):
    source = f'x = "{HOSTILE}"  # {HOSTILE}\n/* {HOSTILE}\n*/ def (\n"unterminated {HOSTILE}\n'
    lines = highlight_lines(source, language)
    assert len(lines) == 4
    html = "".join(lines)
    assert "<script" not in html and "<img" not in html and "</pre>" not in html
    assert re.sub(r"<[^>]+>", "", lines[0]).replace("&lt;", "<").replace("&gt;", ">").replace("&#34;", '"') == source.splitlines()[0]
