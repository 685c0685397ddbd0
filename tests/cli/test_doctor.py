"""`precompile doctor`: what works with this torch, Python and host, and why not."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

FEATURES = [
    "MakeFx tracer", "Dynamo tracer", "eager backend", "inductor backend", "frozen C++ kernels",
    "Triton/CUDA kernels", "no-Inductor load path", "no_compilation() gates", "installed serving mode",
]


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run([sys.executable, "-m", "precompile", "doctor", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_doctor_reports_every_feature_for_this_torch(report):
    assert report["torch"] == str(torch.__version__) and report["supported"] is True
    assert [f["name"] for f in report["features"]] == FEATURES
    assert all(f["detail"] for f in report["features"])


def test_doctor_finds_what_this_suite_relies_on_working(report):
    works = {f["name"]: f["works"] for f in report["features"]}
    for name in ("MakeFx tracer", "Dynamo tracer", "eager backend", "inductor backend", "frozen C++ kernels",
                 "no-Inductor load path", "no_compilation() gates"):
        assert works[name], next(f["detail"] for f in report["features"] if f["name"] == name)
    assert works["Triton/CUDA kernels"] == torch.cuda.is_available()


def test_doctor_says_why_a_missing_compiler_disables_the_inductor_backend():
    proc = subprocess.run(
        [sys.executable, "-m", "precompile", "doctor"], capture_output=True, text=True, timeout=300,
        env={"PATH": "/nonexistent", "CXX": "/nonexistent/c++"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "features work" in proc.stdout.splitlines()[0]
    lines = {line.split()[1]: line for line in proc.stdout.splitlines()[1:] if line.split()[1:2]}
    assert "no CXX, c++, g++ or clang++ on PATH" in proc.stdout and lines["inductor"].split()[0] == "no"
