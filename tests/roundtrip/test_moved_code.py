"""A release that only moved the captured code down its file (comment lines added above `step`) carries
the same bytecode: Dynamo's marshalled code is written as if from line 1, with the line it starts on
beside it, so `precompile diff` says equal (the moves listed apart, not as differences) and every
documented gate passes; served, the code runs at its own lines: a traceback names the line that raised
(issue 51)."""
from __future__ import annotations

import json

import pytest
from conftest import run_fresh
from test_inspect_helpers import run_cli

STEP = '''import torch


{comment}def step(model, x):
    y = model(x)
    if x.sum() > 100:  # a graph break: the raising branch is served by its own code
        raise ValueError("the line that raised")
    return (y * 2).sin()
'''
COMMENT = "# Three comment lines added above the captured function:\n# a release that moves code down\n# its file.\n"
RESTYLED = STEP.replace("    y = model(x)\n", "    # the layer, then a comment-only change\n\n    y = model( x )\n")

CAPTURE = r"""
import sys, torch, precompile
from moved_step import step
torch.manual_seed(0)
with torch.no_grad(), precompile.capture(step, artifact_path="out.py", cache_path="out.cache",
                                         tracer=precompile.DynamoTracer(), backend="eager") as cap:
    cap(torch.nn.Linear(4, 4), torch.ones(2, 4))
"""

SERVE = r"""
import json, traceback, torch, precompile
from moved_step import step
torch.manual_seed(0)
model, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
served = precompile.load("out.py", "out.cache")
with torch.no_grad(), precompile.no_compilation():
    diff = (served(model, x) - step(model, x)).abs().max().item()
    try:
        served(model, x * 100)
        raised = None
    except ValueError:
        frame = traceback.extract_tb(__import__("sys").exc_info()[2])[-1]
        raised = [frame.filename.rsplit("/", 1)[-1], frame.lineno, frame.line]
print(json.dumps({"diff": diff, "raised": raised}))
"""
GATES = (
    ["diff"],
    ["diff", "--stat", "--fail-on", "guards,calling-convention,params,graph,versions"],
    ["diff", "--format", "markdown", "--fail-on", "guards,calling-convention,params,graph,kernels,versions"],
)


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    root = tmp_path_factory.mktemp("moved")
    for name, text in (("before", STEP.format(comment="")), ("moved", STEP.format(comment=COMMENT)),
                       ("restyled", RESTYLED.format(comment=""))):
        (root / name).mkdir()
        (root / name / "moved_step.py").write_text(text)
        proc = run_fresh(CAPTURE, cwd=root / name)
        assert proc.returncode == 0, proc.stderr
    return root


def test_moved_code_diffs_equal_and_passes_every_gate(releases, capsys):
    a, b = str(releases / "before" / "out"), str(releases / "moved" / "out")
    for gate in GATES:
        rc, out, _ = run_cli(capsys, [*gate, a, b])
        assert rc == 0, (gate, out)
    rc, out, _ = run_cli(capsys, ["diff", a, b])
    assert "verdict: equal" in out and "FRAME_LINES step: line 4 -> line 7" in out, out
    rc, out, _ = run_cli(capsys, ["diff", "--json", a, b])
    report = json.loads(out)
    moved = {m["key"]: (m["a"], m["b"]) for m in report["moved"]}
    assert report["equal"] and moved["FRAME_LINES step"] == ("line 4", "line 7"), moved
    # The continuation Dynamo names after the line it resumes at is named by its place among step's.
    assert moved["FRAME_LINES torch_dynamo_resume_in_step_at_<break 1>"] == ("line 6", "line 9"), moved
    assert all(key.startswith(("FRAME_LINES ", "INLINED_SOURCES moved_step ")) for key in moved), moved


def test_restyled_code_is_a_code_difference_only_and_passes_gates_that_leave_code_out(releases, capsys):
    """Comments, blank lines and spacing changed inside `step`: the same tokens, so the same code (load
    serves it), keyed alike in the diff (its inlined source is listed as moved); python_code's text and
    Dynamo's line tables changed, which is what `code` says, and nothing else differs."""
    a, b = str(releases / "before" / "out"), str(releases / "restyled" / "out")
    rc, out, _ = run_cli(capsys, ["diff", "--json", a, b])
    report = json.loads(out)
    assert rc == 1 and {entry["category"] for entry in report["entries"]} <= {"code"}, report["entries"]
    moved = [m["key"] for m in report["moved"]]
    assert any(key.startswith("INLINED_SOURCES moved_step ") for key in moved), moved
    assert all(key.startswith(("FRAME_LINES ", "INLINED_SOURCES moved_step ")) for key in moved), moved
    for gate in GATES[1:]:
        rc, out, _ = run_cli(capsys, [*gate, a, b])
        assert rc == 0, (gate, out)
    proc = run_fresh(SERVE, cwd=releases / "restyled")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["diff"] == 0.0


def test_moved_code_serves_at_its_own_lines(releases):
    for name, first in (("before", 4), ("moved", 7)):
        proc = run_fresh(SERVE, cwd=releases / name)
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["diff"] == 0.0
        assert result["raised"] == ["moved_step.py", first + 3, 'raise ValueError("the line that raised")'], name


def test_a_change_beside_the_move_still_differs(releases, tmp_path, capsys):
    """Masking where code sits hides no change to what it does: the same move with a constant changed."""
    (tmp_path / "moved_step.py").write_text(STEP.format(comment=COMMENT).replace("y * 2", "y * 3"))
    proc = run_fresh(CAPTURE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rc, out, _ = run_cli(capsys, ["diff", str(releases / "before" / "out"), str(tmp_path / "out")])
    assert rc == 1 and "verdict: differ" in out, out


def test_a_first_line_that_is_no_line_number_is_refused_naming_it(releases, tmp_path):
    """A hand-edited `_dynamo_first_lines` gets a clear PrecompileError at load, not Python's OverflowError."""
    import re

    edited = tmp_path / "edited.py"
    text = (releases / "moved" / "out.py").read_text()
    edited.write_text(re.sub(r"^_dynamo_first_lines = \{'0': 7", "_dynamo_first_lines = {'0': 1099511627776", text,
                             flags=re.M))
    proc = run_fresh("import sys, precompile\ntry:\n    precompile.load(sys.argv[1], sys.argv[1] + '.missing')\n"
                     "except precompile.PrecompileError as exc:\n    print(exc)\n", str(edited), cwd=releases / "moved")
    assert proc.returncode == 0, proc.stderr
    assert "its code '0' starts on line 1099511627776, not a line number" in proc.stdout, proc.stdout + proc.stderr
