"""`precompile diff --format markdown` and `--junit FILE`: the output a CI job posts or displays, and
the two-artifact report opening on the diff. Built from the committed fixture pairs (nothing is
compiled); tests/inspect/test_diff_ci_kernels.py captures a pair that differs in one kernel."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from precompile.inspect.diff.diff import CATEGORIES
from precompile.inspect.render.junit import junit_xml
from precompile.inspect.render.render_markdown import code_span, render_markdown
from precompile.inspect.model.report import DiffEntry, DiffReport
from test_inspect_helpers import ROOT, run_cli

GUARDS_PAIR = ["fixtures/v1/dynamo_rows", "fixtures/v1/dynamo_rows_risky"]  # x's tensor guard kept, then risky-dropped
CONVENTION_PAIR = ["fixtures/v1/mlp", "fixtures/v1/mlp_b4"]  # the batch grew: calling-convention (2), code (1)


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_markdown_opens_on_the_verdict_and_names_the_changed_guard_with_both_values(capsys):
    rc, out, err = run_cli(capsys, ["diff", "--format", "markdown", "--fail-on", "guards", *GUARDS_PAIR])
    assert rc == 1, err
    lines = out.splitlines()
    assert lines[0] == "### verdict: differ in guards (1), code (2), metadata (1); fails on guards"
    assert "`TENSOR_MATCH x: kept in scale_rows#0 → risky_dropped: hasattr(" in out
    assert "| guards | 1 | fails |" in lines and "| code | 2 | not gated |" in lines and "| params | 0 | equal |" in lines
    assert [line.split(" | ")[0].lstrip("| ") for line in lines if line.startswith("| ") and "---" not in line][1:] == list(CATEGORIES)
    rc, again, _ = run_cli(capsys, ["diff", "--format", "markdown", "--fail-on", "guards", *GUARDS_PAIR])
    assert again == out  # deterministic


def test_markdown_of_an_equal_pair_says_equal(capsys):
    rc, out, err = run_cli(capsys, ["diff", "--format", "markdown", "fixtures/v1/mlp", "fixtures/v1/mlp"])
    assert rc == 0, err
    assert out.splitlines()[0] == "### verdict: equal"
    assert all(f"| {name} | 0 | equal |" in out for name in CATEGORIES) and "####" not in out


def test_markdown_with_stat_is_the_verdict_and_the_table_and_json_is_one_format(capsys):
    rc, out, _ = run_cli(capsys, ["diff", "--format", "markdown", "--stat", *CONVENTION_PAIR])
    assert rc == 1 and "| calling-convention | 2 | fails |" in out and "####" not in out
    rc, full, _ = run_cli(capsys, ["diff", "--format", "markdown", *CONVENTION_PAIR])
    assert "#### calling-convention (2)" in full and "#### code (1)" in full
    assert "- `args[1]: tensor (8, 8) torch.float32 cpu → tensor (4, 8) torch.float32 cpu`" in full
    rc, _, err = run_cli(capsys, ["diff", "--json", "--format", "markdown", *CONVENTION_PAIR])
    assert rc == 2 and "--json and --format markdown" in err
    assert run_cli(capsys, ["diff", "--format", "json", *CONVENTION_PAIR])[1] == run_cli(capsys, ["diff", "--json", *CONVENTION_PAIR])[1]


def test_markdown_keeps_artifact_text_inert():
    hostile = "a`b``c | <script>alert(1)</script>\nnext"
    report = DiffReport(a="x|y", b="`b`", equal=False, categories={"metadata": 1},
                        entries=(DiffEntry(section="metadata", key=hostile, change="changed", a="1", b="2"),))
    out = render_markdown(report)
    assert "```a`b``c | <script>alert(1)</script> next: 1 → 2```" in out  # a span fenced past its longest run, one line
    assert "precompile diff `x|y` → `` `b` ``" in out
    assert code_span("x" * 1000).endswith("... (1000 characters)`")


def _junit(capsys, tmp_path, *argv):
    path = tmp_path / "diff.xml"
    rc = run_cli(capsys, ["diff", "--junit", str(path), *argv])[0]
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    failed = {name for name, case in cases.items() if case.find("failure") is not None}
    return rc, root, suite, cases, failed


@pytest.mark.parametrize("pair, fail_on, failed", [
    (CONVENTION_PAIR, None, {"calling-convention", "code"}),
    (CONVENTION_PAIR, "calling-convention", {"calling-convention"}),
    (CONVENTION_PAIR, "guards,params,kernels", set()),
    (GUARDS_PAIR, "guards,code", {"guards", "code"}),
    (["fixtures/v1/mlp", "fixtures/v1/mlp"], None, set()),
])
def test_junit_has_a_testcase_per_category_failing_exactly_where_the_gate_does(capsys, tmp_path, pair, fail_on, failed):
    gate = ["--fail-on", fail_on] if fail_on else []
    rc, root, suite, cases, found = _junit(capsys, tmp_path, *gate, *pair)
    assert rc == run_cli(capsys, ["diff", *gate, *pair])[0] == (1 if failed else 0)  # the exit code is unchanged
    assert root.tag == "testsuites" and suite.get("name") == "precompile diff"
    assert list(cases) == list(CATEGORIES) and all(case.get("classname") == "precompile diff" for case in cases.values())
    assert found == failed
    assert suite.get("tests") == str(len(CATEGORIES)) and suite.get("failures") == str(len(failed)) and suite.get("errors") == "0"
    if fail_on == "calling-convention":
        failure = cases["calling-convention"].find("failure")
        assert failure.get("message") == "calling-convention: 2 differences" and "~ inputs args[1]: tensor (8, 8) torch.float32 cpu -> tensor (4, 8)" in failure.text
        assert "not gated" in cases["code"].find("system-out").text  # shown, not failed
    assert [p.name for p in tmp_path.iterdir()] == ["diff.xml"]  # no temporary file left


def test_junit_escapes_what_xml_cannot_carry_and_writes_atomically(capsys, tmp_path):
    hostile = "k\x00\x1b\u202e\ud800]]><x a='1'>&amp;"
    report = DiffReport(a="a", b="b", equal=False, categories={"guards": 1},
                        entries=(DiffEntry(section="guards", key=hostile, change="added", b="v"),))
    failure = ET.fromstring(junit_xml(report, None)).find("testsuite/testcase/failure")
    assert failure.text == "+ guards k\\x00\\x1b\\u202e\ufffd]]><x a='1'>&amp;: v\n"  # as text shows it; not markup
    target = tmp_path / "dir.xml"
    target.mkdir()  # a path that cannot be replaced: an error, no partial file, nothing left behind
    rc, _, err = run_cli(capsys, ["diff", "--junit", str(target), *CONVENTION_PAIR])
    assert rc == 2 and "could not write the JUnit report" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.xml"]


def test_the_two_artifact_report_opens_on_the_diff(capsys, tmp_path):
    output = tmp_path / "r.html"
    rc, _, err = run_cli(capsys, ["report", *GUARDS_PAIR, "-o", str(output)])
    assert rc == 1, err
    html = output.read_text(encoding="utf-8")
    main = html[html.index("<main>"):]
    assert main.index('id="diff"') < main.index('id="artifact-a"') < main.index('id="artifact-b"')
    first = main[:main.index('id="diff-code"')]  # the first screen: the verdict and the semantic changes
    assert "verdict: differ in guards (1), code (2), metadata (1)" in first
    assert "<td>TENSOR_MATCH x</td>" in first and "kept in scale_rows#0" in first and "risky_dropped" in first


def test_the_report_names_a_bundle_kernel_by_its_inductor_name(capsys, tmp_path):
    output = tmp_path / "r.html"
    assert run_cli(capsys, ["report", "fixtures/v1/mlp_inductor", "-o", str(output)])[0] == 0
    html = output.read_text(encoding="utf-8")
    assert '<span class="name">cpp_fused__native_batch_norm_legit_no_training_relu_0 (qs/cqs5' in html


def test_unreadable_input_is_an_error_testcase_and_a_markdown_problem(capsys, tmp_path):
    pair = ["fixtures/damaged/truncated", "fixtures/v1/mlp"]
    rc, _, suite, cases, _ = _junit(capsys, tmp_path, *pair)
    assert rc == 2 and list(cases) == [*CATEGORIES, "inputs"] and suite.get("errors") == "1"
    assert "is truncated" in cases["inputs"].find("error").get("message")
    rc, out, _ = run_cli(capsys, ["diff", "--format", "markdown", *pair])
    assert rc == 2 and "#### problems" in out and "is truncated" in out
