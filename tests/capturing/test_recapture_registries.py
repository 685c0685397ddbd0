"""A capture of a transformers model does not depend on which models the capturing process built
before it (issue 51): transformers files every model class it builds in registries a trace reads
(`_registered_model_output_types`, a set of output classes; `_CAN_RECORD_REGISTRY`, a dict keyed by
`str(model.__class__)`), so what they hold names the process's history, not a setting. MakeFx lists
each under one spelling and does not check it; Dynamo's guards read the dict by key, not by the
position the process's history gave the key (key_lookups). Under both tracers two captures of one
model, one in a process that built GPT-2 first, diff equal, and the artifact captured alone serves in
a process that built GPT-2 first."""
from __future__ import annotations

import ast

import pytest
from conftest import ROOT, fresh_json, run_fresh
from test_inspect_helpers import run_cli

CAPTURE = r"""
import sys, torch, precompile
sys.path.insert(0, sys.argv[3])
from bench.zoo_models import ZOO
out, first, tracer = sys.argv[1:3] + sys.argv[4:5]
if first:  # another model built and run first: the registries fill in another order, with more in them
    other, other_args = ZOO[first].instantiate()
    with torch.no_grad():
        ZOO[first].step(other, *other_args)
zoo = ZOO["bert"]
model, args = zoo.instantiate()
with torch.no_grad(), precompile.capture(zoo.step, artifact_path=out + ".py", cache_path=out + ".cache",
                                         tracer=getattr(precompile, tracer)(), backend="eager") as cap:
    cap(model, *args)
"""

SERVE = r"""
import json, sys, torch, precompile
sys.path.insert(0, sys.argv[2])
from bench.zoo_models import ZOO
other, other_args = ZOO["gpt2"].instantiate()
with torch.no_grad():
    ZOO["gpt2"].step(other, *other_args)
zoo = ZOO["bert"]
model, args = zoo.instantiate()
served = precompile.load(sys.argv[1] + ".py", sys.argv[1] + ".cache")
with torch.no_grad(), precompile.no_compilation():
    print(json.dumps((served(model, *args) - zoo.step(model, *args)).abs().max().item()))
"""


@pytest.fixture(scope="module", params=["MakeFxTracer", "DynamoTracer"])
def captures(request, tmp_path_factory):
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp(f"registries-{request.param}")
    for name, first in (("alone", ""), ("after_gpt2", "gpt2")):
        proc = run_fresh(CAPTURE, str(root / name), first, str(ROOT), request.param)
        if "cannot read back the guard state it saved" in proc.stderr:  # torch 2.11's own refusal (docs/torch-versions.md)
            pytest.skip(proc.stderr.strip().splitlines()[-1])
        assert proc.returncode == 0, proc.stderr
    return root


def test_a_model_built_first_changes_nothing_the_diff_sees(captures, capsys):
    rc, out, _ = run_cli(capsys, ["diff", str(captures / "alone"), str(captures / "after_gpt2")])
    assert rc == 0, out


def test_the_registries_are_listed_alike_and_not_checked(captures):
    from precompile.capturing.makefx.registries import REGISTRY

    if "Dynamo" in captures.name:  # the registry is read by key, whatever position the process gave the key
        registry = "G['__import_transformers_dot_utils_dot_output_capturing']._CAN_RECORD_REGISTRY"
        for name in ("alone", "after_gpt2"):
            tree = ast.parse((captures / f"{name}.py").read_text())
            (variant,) = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                               and getattr(n.targets[0], "id", None) == "GUARDS"))
            assert not any("list(dict.keys(" in line for line in (*variant["checks"], *variant["dropped"])), name
            assert f"DICT_CONTAINS {registry}" in variant["checks"], name
            assert f"SEQUENCE_LENGTH {registry}" in variant["dropped"], name
        return
    for name in ("alone", "after_gpt2"):
        tree = ast.parse((captures / f"{name}.py").read_text())
        records = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                        and getattr(n.targets[0], "id", None) == "SPECIALIZED"))
        registries = {r["name"]: (r["value"], r.get("checked", True)) for r in records
                      if r["name"] in ("_registered_model_output_types", "_CAN_RECORD_REGISTRY")}
        assert registries == {"_registered_model_output_types": (REGISTRY, False),
                              "_CAN_RECORD_REGISTRY": (REGISTRY, False)}, name


def test_captured_alone_serves_where_another_model_was_built_first(captures):
    assert fresh_json(SERVE, str(captures / "alone"), str(ROOT)) <= 1e-5
