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



SERVE_FILLED = r"""
import json, sys, torch, precompile
import key_lookup_cases as cases
artifact, cache, name, fill, orders = sys.argv[1:]
forward, fill = precompile.load(artifact, cache), getattr(cases, f"fill_{fill}")
out = {}
for label, entries in json.loads(orders).items():
    fill(*(tuple(entry) if isinstance(entry, list) else entry for entry in entries))
    x = torch.ones(2, 4)
    with torch.no_grad(), precompile.no_compilation():
        try:
            out[label] = (forward(x) - getattr(cases, name)(x)).abs().max().item()
        except precompile.CallMismatch:
            out[label] = "refused"
print(json.dumps(out))
"""


def _served(tmp_path, fn, fill: str, captured: tuple, orders: dict) -> dict:
    """fn captured with `captured` filled in, served in a fresh process with each of `orders`."""
    import json

    getattr(cases, f"fill_{fill}")(*captured)
    artifact, cache = tmp_path / f"{fn.__name__}.py", tmp_path / f"{fn.__name__}.cache"
    with torch.no_grad(), precompile.capture(fn, artifact_path=artifact, cache_path=cache,
                                             tracer=precompile.DynamoTracer(), backend="eager") as cap:
        cap(torch.ones(2, 4))
    getattr(cases, f"fill_{fill}")()
    return fresh_json(SERVE_FILLED, str(artifact), str(cache), fn.__name__, fill,
                      json.dumps({"as captured": captured, **orders}))


def test_a_nested_registry_whose_value_the_served_code_reads_by_position_is_never_served_wrong(tmp_path):
    """The served bytecode fetches TABLES['weights'][key at position 1] as the graph's input (it names
    the registry by a constant key, not a name): another order is refused, never served another tensor,
    and a registry too short is refused, not a raw StopIteration."""
    served = _served(tmp_path, cases.weighted, "tables", ("Other", "Linear"),
                     {"reversed": ("Linear", "Other"), "alone": ("Linear",)})
    assert served["as captured"] == 0.0
    assert served["reversed"] in (0.0, "refused"), served
    assert served["alone"] in (0.0, "refused"), served


def test_a_key_missing_at_capture_and_present_when_served_is_never_served_wrong(tmp_path):
    """A dict subclass with __missing__: Dynamo checks that 'Missing' is absent only through the keys
    it looked past and R's length, so once 'Missing' is added the call is refused, never served the
    default the capture saw."""
    served = _served(tmp_path, cases.defaulted, "defaults", (("Other", 5.0), ("Linear", 2.0)),
                     {"the missing key added": (("Other", 5.0), ("Linear", 2.0), ("Missing", 3.0))})
    assert served["as captured"] == 0.0
    assert served["the missing key added"] in (0.0, "refused"), served


def test_a_key_spelling_another_keys_position_is_checked_as_itself(tmp_path):
    """QUOTING's literal holds the text of position 1's source: reading the positions as keys must not
    rewrite inside a key already put in, or the artifact checks QUOTED["'b'"] for QUOTING's value:
    its own call refused, and a changed QUOTING served its captured value."""
    served = _served(tmp_path, cases.quoted, "quoted", ((cases.QUOTING, 2.0), ("b", 3.0)),
                     {"QUOTING changed, 'b' quoted added": ((cases.QUOTING, 7.0), ("b", 3.0), ("'b'", 2.0))})
    assert served["as captured"] == 0.0
    assert served["QUOTING changed, 'b' quoted added"] in (0.0, "refused"), served


def test_a_key_error_caught_at_capture_is_never_served_once_the_key_is_added(tmp_path):
    """The KeyError of FALLBACK['Missing'] is caught in fn: as with __missing__, only R's length and the
    keys Dynamo looked past tell a miss, and their guards look just like those of a lookup that hit
    ('Linear' is the last key): once 'Missing' is added the call must be refused, not served 1.0."""
    served = _served(tmp_path, cases.fallback, "fallback", (("Other", 5.0), ("Linear", 2.0)),
                     {"the missing key added": (("Other", 5.0), ("Linear", 2.0), ("Missing", 3.0))})
    assert served["as captured"] == 0.0
    assert served["the missing key added"] in (0.0, "refused"), served
