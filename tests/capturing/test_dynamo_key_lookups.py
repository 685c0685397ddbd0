"""A dict Dynamo guards by key position but the captured code only reads by key (a registry keyed by
class names, filled in the order a process built its models: transformers' `_CAN_RECORD_REGISTRY`) is
checked by key in a standalone artifact: another order, fewer or more keys serve, two captures from
registries filled in another order diff equal. Where the code's result depends on the order or on the
other keys (it iterates the dict), or the served bytecode reads the dict by position (a value of it
lives across a graph break), Dynamo's position guards stay: another order is refused, never served
wrong (issue 51)."""
from __future__ import annotations

import ast

import key_lookup_cases as cases
import pytest
import torch
from conftest import fresh_json
from test_inspect_helpers import run_cli

import precompile

CASES = ("scaled", "scaled_by_all", "scaled_after_break")
CAPTURED_ORDER = (("Other", 5.0), ("Linear", 2.0))
ORDERS = {
    "as captured": CAPTURED_ORDER,
    "alone": (("Linear", 2.0),),
    "another order, more keys": (("Third", 1.0), ("Linear", 2.0), ("Other", 5.0)),
    "its value changed": (("Other", 5.0), ("Linear", 3.0)),
}

SERVE = r"""
import json, sys, torch, precompile
import key_lookup_cases as cases
root, orders = sys.argv[1], json.loads(sys.argv[2])
torch.manual_seed(0)
model, x = torch.nn.Linear(4, 4), torch.ones(2, 4)
served = {name: precompile.load(f"{root}/{name}.py", f"{root}/{name}.cache") for name in cases.CASES}
out = {}
for label, order in orders.items():
    cases.fill(*map(tuple, order))
    for name, forward in served.items():
        with torch.no_grad(), precompile.no_compilation():
            try:
                out[f"{name}: {label}"] = (forward(model, x) - getattr(cases, name)(model, x)).abs().max().item()
            except precompile.CallMismatch as exc:
                out[f"{name}: {label}"] = "refused"
print(json.dumps(out))
"""


def _capture(root, order):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    cases.fill(*order)
    for name in CASES:
        with torch.no_grad(), precompile.capture(getattr(cases, name), artifact_path=root / f"{name}.py",
                                                 cache_path=root / f"{name}.cache", tracer=precompile.DynamoTracer(),
                                                 backend="eager") as cap:
            cap(model, torch.ones(2, 4))


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    roots = {}
    for label, order in (("captured", CAPTURED_ORDER), ("reordered", ORDERS["another order, more keys"])):
        roots[label] = tmp_path_factory.mktemp(label)
        _capture(roots[label], order)
    cases.fill()
    return roots


@pytest.fixture(scope="module")
def served(captured):
    import json

    return fresh_json(SERVE, str(captured["captured"]), json.dumps(ORDERS))


def test_read_by_key_serves_any_order_and_any_other_keys(served):
    for label in ("as captured", "alone", "another order, more keys"):
        assert served[f"scaled: {label}"] == 0.0, label
    assert served["scaled: its value changed"] == "refused"


def test_iterated_or_rebuilt_by_position_keeps_the_order_checked(served):
    for name in ("scaled_by_all", "scaled_after_break"):
        assert served[f"{name}: as captured"] == 0.0, name
        for label in ("alone", "another order, more keys", "its value changed"):
            assert served[f"{name}: {label}"] == "refused", (name, label)


def _guards(path) -> tuple:
    tree = ast.parse(path.read_text())
    return ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "GUARDS"))


def test_the_listing_names_the_key_and_drops_the_length(captured):
    root = captured["captured"]
    assert "list(dict.keys(" not in (root / "scaled.py").read_text()
    (variant,) = _guards(root / "scaled.py")
    assert "DICT_CONTAINS G['REGISTRY']" in variant["checks"]
    assert "CONSTANT_MATCH dict.__getitem__(G['REGISTRY'], 'Linear')['scale']" in variant["checks"]
    assert variant["dropped"] == ("SEQUENCE_LENGTH G['REGISTRY']",)
    for name in ("scaled_by_all", "scaled_after_break"):
        checks = _guards(root / f"{name}.py")[0]["checks"]
        assert "SEQUENCE_LENGTH G['REGISTRY']" in checks and "CONSTANT_MATCH list(dict.keys(G['REGISTRY']))[1]" in checks


def test_captures_from_registries_filled_in_another_order_diff_equal(captured, capsys):
    a, b = captured["captured"], captured["reordered"]
    rc, out, _ = run_cli(capsys, ["diff", str(a / "scaled"), str(b / "scaled")])
    assert rc == 0, out
    rc, out, _ = run_cli(capsys, ["diff", str(a / "scaled_by_all"), str(b / "scaled_by_all")])
    assert rc == 1 and "guards" in out


SERVE_NESTED = r"""
import json, sys, torch, precompile
import key_lookup_cases as cases
forward = precompile.load(sys.argv[1], sys.argv[2])
out = {}
for label, names in json.loads(sys.argv[3]).items():
    cases.fill_tables(*names)
    x = torch.ones(2, 4)
    with torch.no_grad(), precompile.no_compilation():
        try:
            out[label] = (forward(x) - cases.weighted(x)).abs().max().item()
        except precompile.CallMismatch:
            out[label] = "refused"
print(json.dumps(out))
"""


def test_a_nested_registry_whose_value_the_served_code_reads_by_position_is_never_served_wrong(tmp_path):
    """The served bytecode fetches TABLES['weights'][key at position 1] as the graph's input (it names
    the registry by a constant key, not a name): another order is refused, never served another tensor,
    and a registry too short is refused, not a raw StopIteration."""
    import json

    cases.fill_tables("Other", "Linear")
    artifact, cache = tmp_path / "weighted.py", tmp_path / "weighted.cache"
    with torch.no_grad(), precompile.capture(cases.weighted, artifact_path=artifact, cache_path=cache,
                                             tracer=precompile.DynamoTracer(), backend="eager") as cap:
        cap(torch.ones(2, 4))
    cases.fill_tables()
    orders = {"as captured": ("Other", "Linear"), "reversed": ("Linear", "Other"), "alone": ("Linear",)}
    served = fresh_json(SERVE_NESTED, str(artifact), str(cache), json.dumps(orders))
    assert served["as captured"] == 0.0
    assert served["reversed"] in (0.0, "refused"), served
    assert served["alone"] in (0.0, "refused"), served


SERVE_DEFAULTS = r"""
import json, sys, torch, precompile
import key_lookup_cases as cases
forward = precompile.load(sys.argv[1], sys.argv[2])
out = {}
for label, entries in json.loads(sys.argv[3]).items():
    cases.fill_defaults(*map(tuple, entries))
    x = torch.ones(2, 4)
    with torch.no_grad(), precompile.no_compilation():
        try:
            out[label] = (forward(x) - cases.defaulted(x)).abs().max().item()
        except precompile.CallMismatch:
            out[label] = "refused"
print(json.dumps(out))
"""


def test_a_key_missing_at_capture_and_present_when_served_is_never_served_wrong(tmp_path):
    """A dict subclass with __missing__: Dynamo checks that 'Missing' is absent only through the keys
    it looked past and R's length, so once 'Missing' is added the call is refused, never served the
    default the capture saw."""
    import json

    cases.fill_defaults(("Other", 5.0), ("Linear", 2.0))
    artifact, cache = tmp_path / "defaulted.py", tmp_path / "defaulted.cache"
    with torch.no_grad(), precompile.capture(cases.defaulted, artifact_path=artifact, cache_path=cache,
                                             tracer=precompile.DynamoTracer(), backend="eager") as cap:
        cap(torch.ones(2, 4))
    cases.fill_defaults()
    orders = {"as captured": (("Other", 5.0), ("Linear", 2.0)),
              "the missing key added": (("Other", 5.0), ("Linear", 2.0), ("Missing", 3.0))}
    served = fresh_json(SERVE_DEFAULTS, str(artifact), str(cache), json.dumps(orders))
    assert served["as captured"] == 0.0
    assert served["the missing key added"] in (0.0, "refused"), served
