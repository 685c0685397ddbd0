"""The suite draws the same hypothesis examples on every run of a commit (`./dev test`, CI), and
`./dev fuzz` searches afresh with more of them: a landing never fails on a counterexample it did not make."""
from __future__ import annotations

import re
import subprocess
import sys

import property_budget
from conftest import ROOT, TESTS
from hypothesis import settings


def test_the_suite_is_derandomized_and_keeps_no_example_database():
    assert property_budget.PROFILE == "repeatable", "run the suite without PRECOMPILE_HYPOTHESIS (./dev fuzz sets it)"
    assert settings().derandomize and settings().database is None
    assert property_budget.examples(400) == 400


def test_fuzz_searches_afresh_with_more_examples():
    code = ("import property_budget; from hypothesis import settings; s = settings(); "
            "print(property_budget.examples(400), s.derandomize, s.database is None)")
    env = {"PATH": "", "PRECOMPILE_HYPOTHESIS": "fuzz", "FUZZ_FACTOR": "7", "PYTHONPATH": str(TESTS)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["2800", "False", "False"], out.stderr


def test_every_property_test_is_selected_by_fuzz():
    """`./dev fuzz` runs -m hypothesis: a property test whose @given the plugin cannot see is marked by hand."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "hypothesis", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    selected = {line.split("::")[0] for line in out.stdout.splitlines() if "::" in line}
    with_properties = {str(path.relative_to(ROOT)) for path in TESTS.rglob("test_*.py")
                       if re.search(r"^\s*@given\(", path.read_text(encoding="utf-8"), re.MULTILINE)}
    assert with_properties and with_properties <= selected, out.stdout[-2000:]
    assert "tests/roundtrip/test_differential_state.py" in selected
