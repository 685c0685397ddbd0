"""The pytest plugin as a model maintainer uses it: pytester runs a throwaway project with a small model
and `precompile_snapshot`, each run in a fresh pytest process (so each capture is a fresh process's)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest_plugins = ["pytester"]

# Where precompile is installed with its entry point, pytest loads the plugin by itself; this tree may
# be imported from a checkout whose installed metadata predates the entry point: name it then.
INSTALLED = any(ep.name == "precompile" and ep.value == "precompile.testing.plugin"
                for ep in importlib.metadata.entry_points(group="pytest11"))
PLUGIN = () if INSTALLED else ("-p", "precompile.testing.plugin")
ARGS = (*PLUGIN, "-p", "no:cacheprovider", "-p", "no:randomly", "-q")

MODEL = '''
import torch

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, {width})
        self.out = torch.nn.Linear({width}, 4)
        self.scale = {scale}

    def forward(self, x):
        return self.out(torch.relu(self.fc(x))) * self.scale

def step(model, x):
    return model(x)
'''
TESTS = '''
import torch
import precompile
import mylib

def test_dynamo(precompile_snapshot):
    torch.manual_seed(0)
    precompile_snapshot(mylib.step, mylib.Block(), torch.randn(2, 8), tracer=precompile.DynamoTracer(), backend="eager")

def test_makefx(precompile_snapshot):
    torch.manual_seed(0)
    precompile_snapshot(mylib.step, mylib.Block(), torch.randn(2, 8), tracer=precompile.MakeFxTracer(), backend="eager")
'''
PER_TORCH = '''
import torch
import precompile
import mylib

def test_per_torch(precompile_snapshot):
    precompile_snapshot(mylib.step, mylib.Block(), torch.randn(2, 8), tracer=precompile.MakeFxTracer(), backend="eager",
                        per_torch=True, tolerance=1e-6)
'''


def _torch_series() -> str:
    """`torch2.13`, read from torch's installed metadata: importing torch in pytester's own process is not needed."""
    return "torch" + ".".join(importlib.metadata.version("torch").split(".")[:2])


def _failure(result, test: str) -> str:
    """The assertion message pytest printed for `test` (its E lines, prefix stripped)."""
    text = result.stdout.str()
    block = text[text.index(f"_ {test} _"):]
    return "\n".join(line[1:].strip() for line in block.splitlines() if line.startswith("E "))


def test_a_maintainer_locks_a_model_and_a_change_fails_saying_what_changed(pytester, monkeypatch):
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=1.0), test_block=TESTS, test_versions=PER_TORCH)

    written = pytester.runpytest_subprocess(*ARGS, "--snapshot-update", timeout=600)
    written.assert_outcomes(passed=3)
    snapshots = pytester.path / "__snapshots__"
    files = sorted(str(p.relative_to(pytester.path)) for p in pytester.path.glob("__snapshots*/**/*") if p.is_file())
    series = _torch_series()
    assert files == [f"__snapshots__/test_block/{name}" for name in ("test_dynamo.guards.txt", "test_dynamo.py",
                                                                      "test_makefx.guards.txt", "test_makefx.py")] + [
        f"__snapshots_{series}__/test_versions/test_per_torch.guards.txt", f"__snapshots_{series}__/test_versions/test_per_torch.py"]
    for path in (p for p in pytester.path.glob("__snapshots*/**/*") if p.is_file()):
        text = path.read_text(encoding="utf-8")
        assert str(pytester.path) not in text and not re.search(r"(?<![\w.])/(tmp|home|root|usr|work)/", text), path
    table = (snapshots / "test_block" / "test_makefx.guards.txt").read_text(encoding="utf-8")
    assert "[params]\nfc.bias\n    (16,) torch.float32 cpu\n" in table and "attribute args[0].scale\n    1.0\n" in table

    # A plain rerun passes, and pytest collects none of the .py snapshots; a snapshot no test asserts is reported.
    for suffix in (".py", ".guards.txt"):
        (snapshots / "test_block" / f"test_gone{suffix}").write_text("stale\n", encoding="utf-8")
    again = pytester.runpytest_subprocess(*ARGS, timeout=600)
    again.assert_outcomes(passed=3)
    assert re.search(r"2 snapshots unused", again.stdout.str()), again.stdout.str()
    for suffix in (".py", ".guards.txt"):
        (snapshots / "test_block" / f"test_gone{suffix}").unlink()

    # Another thread count, temp dir and working directory: the same snapshots.
    elsewhere = pytester.mkdir("elsewhere")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    monkeypatch.chdir(elsewhere)
    threads = pytester.runpytest_subprocess(*ARGS, f"--rootdir={pytester.path}", str(pytester.path / "test_block.py"), timeout=600)
    threads.assert_outcomes(passed=2)
    monkeypatch.chdir(pytester.path)

    # A layer's width changed: params, for both tracers.
    pytester.makepyfile(mylib=MODEL.format(width=24, scale=1.0))
    wider = pytester.runpytest_subprocess(*ARGS, "test_block.py", timeout=600)
    wider.assert_outcomes(failed=2)
    for test in ("test_dynamo", "test_makefx"):
        message = _failure(wider, test)
        assert message.startswith("AssertionError: verdict: differ in params (3)"), message
        assert re.search(r"fc\.weight: .*\(16, 8\).* -> .*\(24, 8\)", message), message

    # A module constant read in forward changed: guards, with both values, for both tracers.
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=0.5))
    scaled = pytester.runpytest_subprocess(*ARGS, "test_block.py", timeout=600)
    scaled.assert_outcomes(failed=2)
    for test in ("test_dynamo", "test_makefx"):
        message = _failure(scaled, test)
        assert message.startswith("AssertionError: verdict: differ in guards (1)"), message
        change = next(line for line in message.splitlines() if line.startswith("~ ") and "scale" in line)
        before, after = change.split(" -> ")
        assert before.endswith("1.0") and after.endswith("0.5"), change
        assert "--- a/" in message and "+++ b/" in message  # then the changed python_code sections


def test_a_suite_that_never_uses_the_fixture_imports_neither_torch_nor_the_capture_side(pytester):
    pytester.makepyfile(test_plain='''
import sys

def test_plain(pytestconfig):
    names = [getattr(p, "__name__", "") for p in pytestconfig.pluginmanager.get_plugins()]
    assert "precompile.testing.plugin" in names
    assert not [m for m in sys.modules if m == "torch" or m.startswith(("torch.", "precompile.capturing", "precompile.serve.load"))]
''')
    pytester.runpytest_subprocess(*ARGS, timeout=120).assert_outcomes(passed=1)


def test_the_plugin_is_registered_by_installing_precompile():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["pytest11"] == {"precompile": "precompile.testing.plugin"}
    assert any(dep.startswith("syrupy") for dep in project["optional-dependencies"]["pytest"])
    if INSTALLED:  # installed from this tree: pytest finds it by the name -p no:precompile turns off
        (entry,) = [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.name == "precompile"]
        assert entry.load().__name__ == "precompile.testing.plugin"


@pytest.mark.skipif(not INSTALLED, reason="precompile is installed without this tree's entry point")
def test_no_precompile_turns_the_plugin_off(pytester):
    pytester.makepyfile(test_off="def test_off(precompile_snapshot):\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:precompile", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(errors=1)
    assert "fixture 'precompile_snapshot' not found" in result.stdout.str()


GPT = '''
import torch
from transformers import GPT2Config, GPT2LMHeadModel


def make():
    """A tiny GPT-2 from a config, built as a serving process builds it (transformers fills registries here)."""
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=32)
    return GPT2LMHeadModel(config).eval(), torch.arange(8).reshape(1, 8)


def step(model, ids):
    return model(ids).logits
'''
GPT_TESTS = '''
import precompile
import gptlib

def test_dynamo(precompile_snapshot):
    precompile_snapshot(gptlib.step, factory=gptlib.make, tracer=precompile.DynamoTracer(), backend="eager")

def test_makefx(precompile_snapshot):
    precompile_snapshot(gptlib.step, factory=gptlib.make, tracer=precompile.MakeFxTracer(), backend="eager")
'''
NEXT_RELEASE = '''
import os

if os.environ.get("NEXT_RELEASE"):  # a precompile release whose drivers differ from this one's by a comment
    from precompile.codegen import render

    included = render.source_of
    render.source_of = lambda name: "# a comment the next release added\\n" + included(name)
'''
COMMENT = "# mylib: the model this package ships\n# (a comment above the model moves every line below it)\n"


def test_a_transformers_model_built_by_a_factory_passes_under_both_tracers_and_a_comment_above_it(pytester):
    """Served to an unpickled GPT-2, the Dynamo artifact misses (transformers fills a registry when a model is
    constructed): factory= builds the model in the serving process, as a serving process gets its model."""
    if importlib.util.find_spec("transformers") is None:  # not imported here: pytester's process keeps it out
        pytest.skip("transformers is not installed")
    pytester.makepyfile(gptlib=GPT, test_gpt=GPT_TESTS)
    pytester.runpytest_subprocess(*ARGS, "--snapshot-update", timeout=600).assert_outcomes(passed=2)
    pytester.makepyfile(gptlib=COMMENT + GPT)
    pytester.runpytest_subprocess(*ARGS, timeout=600).assert_outcomes(passed=2)


def test_a_factory_is_named_and_used_alone(pytester):
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=1.0), test_factory='''
import torch
import mylib

def test_both(precompile_snapshot):
    precompile_snapshot(mylib.step, mylib.Block(), factory=lambda: (mylib.Block(),))

def test_local(precompile_snapshot):
    precompile_snapshot(mylib.step, factory=lambda: (mylib.Block(), torch.randn(2, 8)))
''')
    result = pytester.runpytest_subprocess(*ARGS, timeout=300)
    result.assert_outcomes(failed=2)
    assert "takes the arguments or a factory that builds them, not both" in _failure(result, "test_both")
    assert "must be importable by module name" in _failure(result, "test_local")


def test_a_precompile_release_that_edits_its_driver_fails_no_snapshot(pytester, monkeypatch):
    """The .py snapshot holds the user's sections; precompile's runtime is one line naming its version."""
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=1.0), test_block=TESTS, conftest=NEXT_RELEASE)
    pytester.runpytest_subprocess(*ARGS, "--snapshot-update", timeout=600).assert_outcomes(passed=2)
    version = importlib.metadata.version("precompile") if INSTALLED else None
    for name in ("test_dynamo", "test_makefx"):
        code = (pytester.path / "__snapshots__" / "test_block" / f"{name}.py").read_text(encoding="utf-8")
        runtime = [line for line in code.splitlines() if line.startswith("# precompile runtime: ")]
        assert [line.split(",")[0] for line in runtime][-1] == "# precompile runtime: driver", runtime
        assert all(re.search(r", precompile \S+, sha256 [0-9a-f]{64}$", line) for line in runtime), runtime
        assert version is None or f"precompile {version}," in runtime[-1]
        assert "# Driver of a" not in code and "def build_forward" not in code
    monkeypatch.setenv("NEXT_RELEASE", "1")
    pytester.runpytest_subprocess(*ARGS, timeout=600).assert_outcomes(passed=2)


def test_a_comment_above_the_model_fails_no_snapshot(pytester):
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=1.0), test_block=TESTS)
    pytester.runpytest_subprocess(*ARGS, "--snapshot-update", timeout=600).assert_outcomes(passed=2)
    pytester.makepyfile(mylib=COMMENT + MODEL.format(width=16, scale=1.0))
    pytester.runpytest_subprocess(*ARGS, timeout=600).assert_outcomes(passed=2)


def test_a_changed_operation_fails_leading_with_the_graph_not_with_lines_or_source_hashes(pytester):
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=1.0), test_block=TESTS)
    pytester.runpytest_subprocess(*ARGS, "--snapshot-update", "-k", "dynamo", timeout=600).assert_outcomes(passed=1)
    pytester.makepyfile(mylib=COMMENT + MODEL.format(width=16, scale=1.0).replace("torch.relu", "torch.sigmoid"))
    result = pytester.runpytest_subprocess(*ARGS, "-k", "dynamo", timeout=600)
    result.assert_outcomes(failed=1)
    message = _failure(result, "test_dynamo")
    assert message.startswith("AssertionError: verdict: differ in"), message
    changed = [line for line in message.splitlines() if line[:1] in "+-~" and not line.startswith(("+++", "---"))]
    assert changed and all("sigmoid" in line or "relu" in line for line in changed[:2]), message
    assert not re.search(r"INLINED_SOURCES|FRAME_LINES|first_line|line \d+ -> line \d+|\.py:\d+", message), message


def _other_minor_python() -> str | None:
    """An interpreter with another torch minor: $PRECOMPILE_OTHER_TORCH_PYTHON, or the newest `./dev compat`
    venv (`.venv-torchVERSION`) beside this interpreter's venv or in this checkout."""
    if os.environ.get("PRECOMPILE_OTHER_TORCH_PYTHON"):
        return os.environ["PRECOMPILE_OTHER_TORCH_PYTHON"]
    for venv in sorted({*Path(sys.prefix).parent.glob(".venv-torch*"), *ROOT.glob(".venv-torch*")}, reverse=True):
        minor = "torch" + ".".join(venv.name.removeprefix(".venv-torch").split(".")[:2])
        if (venv / "bin" / "python").exists() and minor != _torch_series():
            return str(venv / "bin" / "python")
    return None


def _pytest_with(pytester, python: str, *args: str):
    """pytest in `python`'s environment, importing this tree's precompile (the plugin named unless installed there)."""
    probe = ("import importlib.metadata as m; print(any(e.value == 'precompile.testing.plugin' "
             "for e in m.entry_points(group='pytest11')))")
    installed = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    plugin = () if installed == "True" else ("-p", "precompile.testing.plugin")
    return pytester.run(python, "-m", "pytest", *plugin, *ARGS[len(PLUGIN):], *args, timeout=600)


def test_per_torch_keeps_one_set_per_torch_minor_across_updates_and_plain_runs(pytester, monkeypatch):
    other = _other_minor_python()
    if other is None:
        pytest.skip("no interpreter with another torch minor (./dev compat VERSION makes one, or set PRECOMPILE_OTHER_TORCH_PYTHON)")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), str(pytester.path), os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(mylib=MODEL.format(width=16, scale=1.0), test_versions=PER_TORCH)
    here = pytester.runpytest_subprocess(*ARGS, "--snapshot-update", timeout=600)
    here.assert_outcomes(passed=1)
    there = _pytest_with(pytester, other, "--snapshot-update")
    there.assert_outcomes(passed=1)
    written = {path.parent.parent.name for path in pytester.path.rglob("test_per_torch.py") if path.parent.name == "test_versions"}
    assert len(written) == 2, (written, there.stdout.str())  # the other minor's update deleted none of this one's

    for run in (pytester.runpytest_subprocess(*ARGS, timeout=600), _pytest_with(pytester, other)):
        run.assert_outcomes(passed=1)
        assert run.ret == 0 and "unused" not in run.stdout.str(), run.stdout.str()
