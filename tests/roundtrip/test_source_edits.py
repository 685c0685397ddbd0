"""A release whose captured code was edited after capture (a bug fix, a library upgrade) must not serve
the graph that baked in the old code: both tracers record the text of each function they ran (a
MakeFx trace the functions it ran, Dynamo the ones it inlined) and load refuses where one changed,
naming the module and lines. Code that only moved (lines added above it) is the same code, a closure it
calls included, and so is code whose only change is a comment, a blank line or a line's spacing: it
serves.
Each state is served by a fresh process, which imports the module as it is on disk then."""
from __future__ import annotations

import json

import pytest
from conftest import run_fresh

STEP = '''import torch


{comment}def make_act(k):
    def act(y):
        return y * k
    return act


ACT = make_act(0.5)  # a closure the step calls: checked by its code's text, which a move keeps


def step(model, x):
    y = model(x)
    return ACT((y * 2).sin())
'''
COMMENT = "# Two comment lines added above the captured function:\n# a release that moves code down.\n"


def restyled(text: str) -> str:
    """The same tokens: a comment line and a blank line inside both functions, a line's spacing and a
    trailing comment changed."""
    return (text.replace("        return y * k", "        # scale by the closed-over factor\n\n        return y*k")
            .replace("    y = model(x)\n", "    y = model( x )  # the layer\n\n    # then the activation\n"))

CAPTURE = r"""
import sys, torch, precompile
from edited_step import step
torch.manual_seed(0)
tracer = precompile.MakeFxTracer() if sys.argv[1] == "makefx" else precompile.DynamoTracer()
with torch.no_grad(), precompile.capture(step, artifact_path="out.py", cache_path="out.cache", tracer=tracer,
                                         backend="eager") as cap:
    cap(torch.nn.Linear(4, 4), torch.ones(2, 4))
"""

SERVE = r"""
import json, torch, precompile
from edited_step import step
torch.manual_seed(0)
model, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
try:
    served = precompile.load("out.py", "out.cache")
    with torch.no_grad():
        outcome = "same" if torch.equal(served(model, x), step(model, x)) else "SILENTLY DIFFERENT"
except precompile.PrecompileError as exc:
    outcome = "refused: " + str(exc)
print(json.dumps(outcome))
"""


@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_an_edited_function_is_refused_at_load_and_a_moved_or_restyled_one_serves(tmp_path, tracer):
    module = tmp_path / "edited_step.py"
    module.write_text(STEP.format(comment=""))
    proc = run_fresh(CAPTURE, tracer, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    outcomes = {}
    for state, text in (("unchanged", STEP.format(comment="")), ("moved", STEP.format(comment=COMMENT)),
                        ("restyled", restyled(STEP.format(comment=COMMENT))),
                        ("edited", STEP.format(comment="").replace("y * 2", "y * 3"))):
        module.write_text(text)
        proc = run_fresh(SERVE, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        outcomes[state] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcomes["unchanged"] == outcomes["moved"] == outcomes["restyled"] == "same", outcomes
    assert outcomes["edited"].startswith("refused: ") and "the source of edited_step.step (lines 13-15 at capture) changed since capture" \
        in outcomes["edited"] and "capture the artifact again" in outcomes["edited"], outcomes


TWINS = '''import torch


class Used(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sin()


class Twin(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sin()


def step(model, x):
    return model(x)
'''

TWIN_CAPTURE = CAPTURE.replace("from edited_step import step", "from edited_step import step, Used").replace(
    "torch.nn.Linear(4, 4)", "Used()")
TWIN_SERVE = SERVE.replace("from edited_step import step", "from edited_step import step, Used").replace(
    "torch.nn.Linear(4, 4)", "Used()")


@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_an_edited_function_whose_old_text_a_twin_still_holds_is_refused(tmp_path, tracer):
    """Two classes whose forwards read alike (transformers' BertSelfOutput and BertOutput): the one the
    capture ran is edited, the other keeps the old text. Load looks for the edited function by its name
    where it now sits, not for its old text anywhere in the file."""
    module = tmp_path / "edited_step.py"
    module.write_text(TWINS)
    proc = run_fresh(TWIN_CAPTURE, tracer, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    module.write_text(TWINS.replace("return (x * 2).sin()", "return (x * 3).sin()", 1))
    proc = run_fresh(TWIN_SERVE, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "the source of edited_step.Used.forward (lines 5-6 at capture) changed since capture" in outcome, outcome


CALLED_BACK = '''import contextlib
import functools

import torch


@contextlib.contextmanager
def scaled():
    yield 2.0


class Model(torch.nn.Linear):
    @functools.cached_property
    def shift(self):
        return 1.0


def step(model, x):
    with scaled() as factor:
        return model(x) * factor + model.shift
'''


@pytest.mark.parametrize("edit", [("yield 2.0", "yield 3.0"), ("return 1.0", "return 5.0")])
def test_code_the_standard_library_calls_for_fn_is_checked_too(tmp_path, edit):
    """A @contextmanager's body and a cached_property's getter run for fn, called from contextlib's
    and functools' frames: a MakeFx trace records them as the code it ran, so an edit is refused."""
    module = tmp_path / "edited_step.py"
    module.write_text(CALLED_BACK)
    capture = CAPTURE.replace("from edited_step import step", "from edited_step import step, Model").replace(
        "torch.nn.Linear(4, 4)", "Model(4, 4)")
    proc = run_fresh(capture, "makefx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    module.write_text(CALLED_BACK.replace(*edit))
    serve = SERVE.replace("from edited_step import step", "from edited_step import step, Model").replace(
        "torch.nn.Linear(4, 4)", "Model(4, 4)")
    proc = run_fresh(serve, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome.startswith("refused: ") and "changed since capture" in outcome, outcome


EDITED_AFTER_IMPORT = r"""
import torch, precompile
import edited_step
path = edited_step.__file__
text = open(path).read()
open(path, "w").write(text.replace("y * 2", "y * 3"))  # a notebook's edit, not imported again
try:
    with torch.no_grad(), precompile.capture(edited_step.step, artifact_path="out.py", cache_path="out.cache",
                                             tracer=precompile.MakeFxTracer(), backend="eager") as cap:
        cap(torch.nn.Linear(4, 4), torch.ones(2, 4))
    print("captured")
except precompile.CaptureRefused as exc:
    print(exc)
"""


def test_a_module_edited_after_import_is_refused_at_capture(tmp_path):
    """The trace runs the code imported before the edit; the file holds the new text, which the artifact
    would record and a fresh process would import and pass: refused, naming the module."""
    (tmp_path / "edited_step.py").write_text(STEP.format(comment=""))
    proc = run_fresh(EDITED_AFTER_IMPORT, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "module edited_step's file" in proc.stdout and "no longer holds the code the trace ran (step, line 13)" \
        in proc.stdout and "changed after this process imported it" in proc.stdout, proc.stdout
    assert not (tmp_path / "out.py").exists()


SAME_NAMED = '''import sys

import torch

if sys.version_info >= (3, 8):
    def helper(y):
        return y * 2
else:
    def helper(y):
        return y * 2

ACT = lambda t: t.sin()  # noqa: E731


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self._scale = 2.0

    @property
    def scale(self):
        return self._scale

    @scale.setter
    def scale(self, value):
        self._scale = value

    def forward(self, x):
        return ACT(helper(self.lin(x)) * self.scale)


def step(model, x):
    return model(x)
'''
SAME_NAMED_STATES = {
    # the getter that shares its name with a setter, with a comment inside; the lambda moved and commented
    "restyled": ("same", ("    def scale(self):\n", "    def scale(self):\n        # the stored factor\n"),
                 ("ACT = lambda t: t.sin()  # noqa: E731", "\nACT = lambda t: t.sin()  # noqa: E731, the activation")),
    # the branch that runs edited; the other branch still holds the old text
    "twin edited": ("refused: the source of edited_step.helper (lines 6-7 at capture)", ("return y * 2", "return y * 3")),
    # a second forward below the first, which Python binds instead: the captured one's text is unchanged
    "redefined": ("refused: the source of edited_step.Block.forward (lines 29-30 at capture)",
                  ("def step(", "    def forward(self, x):\n        return self.lin(x) * 3\n\n\ndef step(")),
}


@pytest.mark.parametrize("tracer", ["makefx", "dynamo"])
def test_defs_that_share_a_name_are_told_apart_by_their_place(tmp_path, tracer):
    """A property's getter and setter, the defs of an `if`'s branches, a method defined twice: load finds
    the captured def as the same one of as many defs of its name, so an edit to the branch that runs is
    refused though the other branch holds the old text, a def added under the name is refused though
    the captured one is unchanged, and a comment inside the getter, or beside a moved lambda, serves."""
    module = tmp_path / "edited_step.py"
    module.write_text(SAME_NAMED)
    capture = CAPTURE.replace("from edited_step import step", "from edited_step import step, Block").replace(
        "torch.nn.Linear(4, 4)", "Block()")
    proc = run_fresh(capture, tracer, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    serve = SERVE.replace("from edited_step import step", "from edited_step import step, Block").replace(
        "torch.nn.Linear(4, 4)", "Block()")
    for state, (expected, *edits) in SAME_NAMED_STATES.items():
        text = SAME_NAMED
        for old, new in edits:
            assert old in text
            text = text.replace(old, new, 1) if state != "redefined" else text.replace(old, new)
        module.write_text(text)
        proc = run_fresh(serve, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        outcome = json.loads(proc.stdout.strip().splitlines()[-1])
        assert outcome.startswith(expected.replace("refused: ", "refused: " + str(tmp_path / "out.py") + ": ")
                                  if expected.startswith("refused") else expected), (state, outcome)
