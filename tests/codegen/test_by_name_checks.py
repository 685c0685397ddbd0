"""An installed artifact runs each variant's by-name lines as one compiled guard (drivers/dynamo_checks.py
_add_by_name_checks); these tests hold it to what each line's own check (by_name_check, which the
capture runs on its own state) answers, and a miss to naming the line that failed."""
from __future__ import annotations

import contextvars
import enum
import types

import pytest
import torch

from precompile.codegen.drivers import dynamo_checks as driver

SCALE_VAR = contextvars.ContextVar("scale")


class Base:
    OFFSET = 1.0


class Child(Base):
    pass


class Mode(enum.Enum):
    FAST = 1


LINES = [
    "CONSTANT_MATCH G['settings'].SCALE == 2.0",
    "SEQUENCE_LENGTH len(G['settings'].WEIGHTS) == 2",
    "CONSTANT_MATCH type(L['self']).__mro__[1].__dict__['OFFSET'] == 1.0",
    "CONSTANT_MATCH G['settings'].LIMIT == float('inf')",
    "CONSTANT_MATCH G['settings'].MISSING == float('nan')",
    "EQUALS_MATCH G['settings'].DEVICE == torch.device('cpu')",
    "CONSTANT_MATCH G['settings'].VAR.get() == 3",
    "ID_MATCH L['fn'] is torch:relu",
    "ID_MATCH L['self'].mode is enum:Enum",
    "CONSTANT_MATCH G['settings'].TABLE['a b'] == 'x'",
    "CONSTANT_MATCH L['args'][1] == None",
    "CONSTANT_MATCH G['settings'].FROZEN == frozenset({'a', 'b'})",
]


def _scope():
    settings = types.SimpleNamespace(SCALE=2.0, WEIGHTS=[1, 2], LIMIT=float("inf"), MISSING=float("nan"),
                                     DEVICE=torch.device("cpu"), VAR=SCALE_VAR, TABLE={"a b": "x"},
                                     FROZEN=frozenset({"b", "a"}))
    return {"settings": settings}


def _locals():
    child = Child()
    child.mode = enum.Enum
    return {"self": child, "fn": torch.relu, "args": (0, None)}


# Each change makes exactly one line fail (by its index in LINES).
CHANGES = {
    0: lambda g, f: setattr(g["settings"], "SCALE", 3.0),
    1: lambda g, f: g["settings"].WEIGHTS.append(3),
    2: lambda g, f: setattr(Base, "OFFSET", 2.0),
    3: lambda g, f: setattr(g["settings"], "LIMIT", 1e308),
    4: lambda g, f: setattr(g["settings"], "MISSING", 0.0),
    5: lambda g, f: setattr(g["settings"], "DEVICE", torch.device("meta")),
    6: lambda g, f: SCALE_VAR.set(4),
    7: lambda g, f: f.update(fn=torch.tanh),
    8: lambda g, f: setattr(f["self"], "mode", Mode),
    9: lambda g, f: g["settings"].TABLE.update({"a b": "y"}),
    10: lambda g, f: f.update(args=(0, 0)),
    11: lambda g, f: setattr(g["settings"], "FROZEN", frozenset({"a"})),
    12: lambda g, f: setattr(g["settings"], "SCALE", 2),  # an int equal to the float pinned: another type
    13: lambda g, f: delattr(g["settings"], "WEIGHTS"),  # a source no longer there
}
FAILS = {12: 0, 13: 1}  # the line each change past the last line's fails


class _Root:
    def add_lambda_guard(self, check, parts, _):
        self.check, self.parts = check, parts


def _guard(scope, lines=LINES):
    manager = types.SimpleNamespace(root=_Root())
    per_line = driver._add_by_name_checks(manager, lines, scope, "a.py")
    return manager.root, per_line


@pytest.fixture(autouse=True)
def _restore():
    token = SCALE_VAR.set(3)
    yield
    SCALE_VAR.reset(token)
    Base.OFFSET = 1.0


def test_the_compiled_guard_holds_where_every_line_holds():
    scope, f_locals = _scope(), _locals()
    root, per_line = _guard(scope)
    assert all(check(f_locals) for _, check in per_line)
    assert root.check(f_locals) is True
    assert root.parts == [driver._BY_NAME]


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_fails_the_compiled_guard_and_the_one_line_it_touched(change):
    scope, f_locals = _scope(), _locals()
    root, per_line = _guard(scope)
    CHANGES[change](scope, f_locals)
    failing = [at for at, (_, check) in enumerate(per_line) if not check(f_locals)]
    expected = FAILS.get(change, change)
    assert failing == [expected]
    assert root.check(f_locals) is False
    words, _ = per_line[expected]
    assert words == f"{LINES[expected].split(' ', 1)[0]}: {LINES[expected].split(' ', 1)[1]}"
    guards = driver._TorchGuards(types.SimpleNamespace(check_verbose=lambda _: types.SimpleNamespace(
        verbose_code_parts=[driver._BY_NAME])), scope, by_name=per_line)
    assert guards.explain(f_locals).startswith(words)


@pytest.mark.parametrize("at", range(len(LINES)))
def test_each_line_compiled_alone_answers_as_its_own_check(at):
    for change in [None, *sorted(CHANGES)]:
        scope, f_locals = _scope(), _locals()
        root, per_line = _guard(scope, [LINES[at]])
        if change is not None:
            CHANGES[change](scope, f_locals)
        assert root.check(f_locals) is bool(per_line[0][1](f_locals)), (LINES[at], change)
        Base.OFFSET = 1.0
        SCALE_VAR.set(3)


def test_an_attribute_that_is_a_keyword_is_read_by_getattr():
    scope = {"settings": types.SimpleNamespace(**{"class": 1})}
    root, _ = _guard(scope, ["CONSTANT_MATCH G['settings'].class == 1"])
    assert root.check({}) is True
    setattr(scope["settings"], "class", 2)
    assert root.check({}) is False
