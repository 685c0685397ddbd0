"""The pytest plugin as a model maintainer uses it: pytester runs a throwaway project with a small model
and `precompile_snapshot`, each run in a fresh pytest process (so each capture is a fresh process's)."""
from __future__ import annotations

import importlib.metadata
import re
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
    import torch

    return "torch" + ".".join(torch.__version__.split(".")[:2])


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
    files = sorted(str(p.relative_to(snapshots)) for p in snapshots.rglob("*") if p.is_file())
    series = _torch_series()
    assert files == [f"test_block/{name}" for name in ("test_dynamo.guards.txt", "test_dynamo.py", "test_makefx.guards.txt",
                                                        "test_makefx.py")] + [
        f"{series}/test_versions/test_per_torch.guards.txt", f"{series}/test_versions/test_per_torch.py"]
    for path in (p for p in snapshots.rglob("*") if p.is_file()):
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
