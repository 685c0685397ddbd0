"""The child interpreters precompile starts never run files from the directory it was run in: a
json.py, torch.py or precompile.py beside an artifact that would create a canary file is never
imported by `precompile doctor`'s load-path probe or `precompile demo`'s serving process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from precompile.cli import child_python

ROOT = Path(__file__).resolve().parent.parent.parent
SHADOWS = ("json.py", "torch.py", "precompile.py")
# The parent runs with its own cwd taken off sys.path (as a `precompile` console script has it), so
# only the children it starts could import the planted files.
PARENT = "import sys; sys.path[:] = [p for p in sys.path if p not in ('', __import__('os').getcwd())]; " \
         "from precompile.cli.main import main; sys.exit(main(sys.argv[1:]))"


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A directory holding modules that would create `CANARY` beside them if imported; it is the cwd."""
    directory = tmp_path / "artifacts"
    directory.mkdir()
    for name in SHADOWS:
        (directory / name).write_text(f"open({str(directory / 'CANARY')!r}, 'a').write({name!r} + '\\n')\n")
    monkeypatch.chdir(directory)
    return directory


def test_doctor_probe_does_not_import_from_the_cwd(planted):
    proc = subprocess.run(
        [sys.executable, "-c", PARENT, "doctor", "--json", "--no-compiler-probe"], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    probe = next(f for f in json.loads(proc.stdout)["features"] if f["name"] == "no-Inductor load path")
    assert probe["works"], probe["detail"]
    assert not (planted / "CANARY").exists(), (planted / "CANARY").read_text()


def test_demo_serves_in_an_empty_dir_without_importing_from_the_cwd(planted, monkeypatch):
    import precompile.cli.demo as demo
    from precompile.cli.main import main

    calls = []
    real_run = subprocess.run

    def run(argv, **kwargs):
        calls.append((argv, kwargs))
        return real_run(argv, **kwargs)

    monkeypatch.setattr(demo.subprocess, "run", run)
    assert main(["--color", "never", "demo", "out", "--backend", "eager"]) == 0
    assert not (planted / "CANARY").exists(), (planted / "CANARY").read_text()
    [(argv, kwargs)] = calls
    assert argv[:len(child_python.SAFE_PATH_FLAGS) + 1] == [sys.executable, *child_python.SAFE_PATH_FLAGS]
    assert argv[-2:] == [str(planted / "out" / "transformer.py"), str(planted / "out" / "transformer.cache")]
    assert Path(kwargs["cwd"]) != planted and not Path(kwargs["cwd"]).exists()  # a fresh directory, removed after


def test_a_child_finds_precompile_when_the_parent_found_it_through_its_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(child_python.package_root())
    root = child_python.package_root()
    monkeypatch.setattr(sys, "path", [root, *(p for p in sys.path if os.path.realpath(p or ".") != root)])
    monkeypatch.setenv("PYTHONPATH", "relative" + os.pathsep + os.pathsep + str(tmp_path))
    entries = child_python.environment()["PYTHONPATH"].split(os.pathsep)
    assert entries == [os.path.join(root, "relative"), str(tmp_path), root]
