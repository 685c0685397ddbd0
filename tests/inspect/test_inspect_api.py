"""The Python API precompile.inspect exports (docs/api.md): each function returns, typed, what its
verb's --json prints, and the names it exports are the documented ones."""
from __future__ import annotations

import json
import subprocess
import sys

import msgspec
import pytest

import precompile.inspect as inspect_api
from precompile.inspect import (
    DiffReport,
    GuardsReport,
    ShowReport,
    VerifyReport,
    diff_report,
    guards_report,
    open_path,
    scan_pickle,
    show_report,
    verify_report,
)
from precompile.inspect.model.report import encode
from test_inspect_helpers import FIXTURES, run_cli

MLP, MLP_B4 = str(FIXTURES / "v1" / "mlp"), str(FIXTURES / "v1" / "mlp_b4")


def test_every_exported_name_resolves_and_none_is_a_submodule():
    for name in inspect_api.__all__:
        value = getattr(inspect_api, name)
        assert type(value).__name__ != "module", name


@pytest.mark.parametrize(("verb", "call", "kind"), [
    ("show", lambda: show_report(open_path(MLP)), ShowReport),
    ("guards", lambda: guards_report(open_path(MLP)), GuardsReport),
    ("verify", lambda: verify_report(open_path(MLP, deep=True)), VerifyReport),
    ("diff", lambda: diff_report(open_path(MLP), open_path(MLP_B4)), DiffReport),
])
def test_each_function_returns_what_its_verb_prints_as_json(capsys, verb, call, kind):
    report = call()
    assert isinstance(report, kind)
    paths = [MLP, MLP_B4] if verb == "diff" else [MLP]
    _, out, _ = run_cli(capsys, [verb, "--json", *paths])
    assert json.loads(encode(report)) == json.loads(out)


def test_diff_takes_two_opened_artifacts_and_names_the_categories():
    report = diff_report(open_path(MLP), open_path(MLP_B4))
    assert not report.equal and set(report.categories) <= set(inspect_api.CATEGORIES)
    assert msgspec.json.decode(msgspec.json.encode(report), type=DiffReport) == report


def test_scan_pickle_names_what_a_pickle_would_import():
    import pickle

    scan = scan_pickle(pickle.dumps(print), member="p")
    assert [(i.module, i.name) for i in scan.imports] == [("builtins", "print")]


def test_importing_the_api_imports_no_torch_and_loads_the_verbs_only_when_asked():
    code = ("import sys, precompile.inspect as i; before = 'precompile.inspect.diff.diff' in sys.modules; i.diff_report; "
            "print(before, 'precompile.inspect.diff.diff' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "False"]
