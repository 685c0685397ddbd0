"""`precompile diff` of two captures of the same code, each in its own fresh process, says equal:
the names Dynamo mints per process (graph uuids, continuation counters) never reach the artifact,
which names them from what it holds (and diff masks them in older artifacts)."""
from __future__ import annotations

import pytest

from conftest import run_fresh
from test_inspect_helpers import run_cli

CAPTURE = r"""
import sys, torch, precompile, dynamo_cases as dc
directory, name, case, warm = sys.argv[1:5]
if warm == "warm":
    # Compile something else first, so this process's counters and uuids differ from the other's.
    torch.compile(lambda x: torch._dynamo.graph_break() or x.cos(), backend="eager")(torch.ones(2))
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
calls = {"break": [((model, torch.ones(4, 8)), {}), ((model, torch.ones(4, 8)), {"scale": 3.0})],
         "global": [((torch.ones(4, 8),), {})], "type": [((model, torch.ones(4, 8)), {})]}[case]
fn = {"break": dc.break_and_scale, "global": dc.uses_global, "type": dc.names_its_type}[case]
with torch.no_grad(), precompile.capture(fn, artifact_path=f"{directory}/{name}.py", cache_path=f"{directory}/{name}.cache",
                                         tracer=precompile.DynamoTracer(), backend="eager") as cap:
    for args, kwargs in calls:
        cap(*args, **kwargs)
"""


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    directory = tmp_path_factory.mktemp("determinism")
    for name, case, warm in (("a", "break", "cold"), ("b", "break", "warm"), ("other", "global", "cold"),
                             ("type-a", "type", "cold"), ("type-b", "type", "warm")):
        proc = run_fresh(CAPTURE, str(directory), name, case, warm, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return directory


def test_two_processes_capturing_the_same_code_diff_as_equal(capsys, captures):
    text = (captures / "a.py").read_text()
    assert "__compiled_fn_" not in text and "__resume_at_" not in text and "__builtins_dict__" not in text
    rc, out, err = run_cli(capsys, ["diff", str(captures / "a"), str(captures / "b")])
    assert rc == 0, out + err
    assert "no differences" in out


def test_a_global_dynamo_installs_by_object_id_diffs_equal_and_serves_fresh(capsys, captures):
    """transformers' GPT-2 has Dynamo install torch as `_<id>_c<n>` and guard on its `.Tensor`: every
    process names it anew, yet two captures of the same code are equal (issue 51) and serve."""
    rc, out, err = run_cli(capsys, ["diff", "--fail-on", "guards,calling-convention,code", str(captures / "type-a"),
                                    str(captures / "type-b")])
    assert rc == 0 and "no differences" in out, out + err
    serve = """
import sys, torch, precompile, dynamo_cases as dc
torch.manual_seed(0)
model, x = torch.nn.Linear(8, 8), torch.ones(4, 8)
served = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
with torch.no_grad(), precompile.no_compilation():
    assert torch.equal(served(model, x), dc.names_its_type(model, x))
"""
    proc = run_fresh(serve, str(captures / "type-b"))
    assert proc.returncode == 0, proc.stderr


def test_the_captures_are_the_same_bytes_and_diff_still_sees_real_changes(capsys, captures):
    # b's process compiled something first, so Dynamo minted other names there: none reached b.
    assert (captures / "a.py").read_bytes() == (captures / "b.py").read_bytes()
    rc, out, _ = run_cli(capsys, ["diff", str(captures / "a"), str(captures / "other")])
    assert rc == 1 and "FN_NAME: dynamo_cases.break_and_scale -> dynamo_cases.uses_global" in out


def test_a_swapped_opaque_state_is_a_difference(capsys, captures, tmp_path):
    """Masking minted names must not hide the one unreadable part: a different pickle there is reported."""
    import base64
    import pickle
    import re
    import shutil

    source = (captures / "a.py").read_text()
    swapped = base64.b64encode(pickle.dumps({"codes": []}, protocol=4)).decode()
    # A standalone artifact pickles nothing (`_dynamo_state = None`): a pickle put there is reported.
    edited, count = re.subn(r"\n_dynamo_state = None\n", f"\n_dynamo_state = ({swapped!r},)\n", source)
    assert count == 1
    (tmp_path / "s.py").write_text(edited)
    shutil.copy(captures / "a.cache", tmp_path / "s.cache")
    rc, out, _ = run_cli(capsys, ["diff", str(captures / "a"), str(tmp_path / "s")])
    assert rc == 1 and "section opaque-remainder (changed)" in out
    assert f"+_dynamo_state = ({swapped!r},)" in out  # short: shown as written, not as a fingerprint


MOVED = r"""
import sys, torch, precompile
sys.path.insert(0, sys.argv[1])
import moved_step
torch.manual_seed(0)
with torch.no_grad(), precompile.capture(moved_step.step, artifact_path=sys.argv[2] + ".py", cache_path=sys.argv[2] + ".cache",
                                         tracer=precompile.DynamoTracer(), backend="eager") as cap:
    cap(torch.nn.Linear(8, 8), torch.ones(4, 8))
"""


def test_a_comment_above_the_captured_code_passes_the_documented_gate(capsys, tmp_path):
    """Two releases whose only difference is two comment lines above fn: its frame's first line and its
    inlined source's lines moved, which is where code sits, not what it does: equal, the moves listed."""
    code = "import torch\n\n\n{}def step(model, x):\n    return model(x).relu() * 2\n"
    for name, text in (("a", code.format("")), ("b", code.format("# a comment\n# and another\n"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "moved_step.py").write_text(text)
        proc = run_fresh(MOVED, str(tmp_path / name), str(tmp_path / f"release-{name}"), timeout=300)
        assert proc.returncode == 0, proc.stderr
    a, b = str(tmp_path / "release-a"), str(tmp_path / "release-b")
    rc, out, err = run_cli(capsys, ["diff", "--fail-on", "guards,calling-convention,params,versions", a, b])
    assert rc == 0, out + err
    assert "FRAME_LINES step: line 4 -> line 6" in out and "verdict: equal" in out
    rc, out, _ = run_cli(capsys, ["diff", "--stat", a, b])
    assert rc == 0 and "verdict: equal" in out and "moved (2;" in out, out
