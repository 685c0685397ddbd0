"""A guard function reads each shared source once into a local, and still fails exactly the check
the spelled-out checks would fail, in the same order; `precompile guards` spells the locals out."""
from __future__ import annotations

import random
import types

import pytest

from precompile.capturing.dynamo.guard_function import guard_function
from precompile.capturing.dynamo.shared_sources import shared_sources
from precompile.inspect.parsing.rendered_guards import _SpelledOut, rendered_checks

CHECKS = [
    ("TYPE_MATCH model", "type(L['m']) is Box"),
    ("CONSTANT_MATCH model.a.b", "type(L['m'].a.b) is int and L['m'].a.b == 3"),
    ("HASATTR model.a (c)", "hasattr(L['m'].a, 'c')"),
    ("EQUALS_MATCH x or model.d", "L['x'] is None or L['m'].d.e == 1"),  # model.d read only if x is not None
    ("CONSTANT_MATCH model.d.e", "L['m'].d.e == 1"),
    ("CONSTANT_MATCH model.a.c", "L['m'].a.c is True"),
    ("DICT_CONTAINS G['REG'] ('k')", "dict.__contains__(G['REG'], 'k')"),
    ("TYPE_MATCH model.d", "type(L['m'].d.f if isinstance(L['m'].d, Box) else L['m'].d) is int"),
]


class Box:
    pass


def _variant(checks):
    return types.SimpleNamespace(prefix="0_0", global_state=None, tensors=(), tensor_sources=(), lines=checks,
                                 aliasing=(), marking=(), notes=[], origins={})


def _spelled_out_verdict(L, G):
    """What the checks decide read one by one, each path spelled out: the first that fails or raises."""
    for label, condition in CHECKS:
        try:
            if not eval(condition, {"Box": Box}, {"L": L, "G": G}):
                return label
        except Exception:  # noqa: BLE001 - a source that is not there fails its check
            return label
    return None


def _model(rng):
    """A model of random shape: any attribute may be missing, of another type, or another value."""
    def maybe(obj, name, value):
        if rng.random() < 0.85:
            setattr(obj, name, value)

    model, a, d = Box(), Box(), Box()
    maybe(a, "b", rng.choice([3, 3, 3, 4, "3"]))
    maybe(a, "c", rng.choice([True, True, False]))
    maybe(d, "e", rng.choice([1, 1, 2]))
    maybe(d, "f", rng.choice([1, "1"]))
    maybe(model, "a", a)
    maybe(model, "d", rng.choice([d, d, d, 5]))
    return rng.choice([model, model, model, object()])


def test_the_guard_function_fails_the_check_the_spelled_out_checks_fail():
    text = guard_function(_variant(CHECKS), "Frame 0 (fn), variant 0")
    namespace = {"Box": Box}
    exec(compile(text, "<guards>", "exec"), namespace)
    rng = random.Random(25)
    verdicts = set()
    for _ in range(2000):
        L = {"m": _model(rng), "x": rng.choice([None, None, 1])}
        G = {"REG": rng.choice([{"k": 1}, {}])} if rng.random() < 0.9 else {}
        verdict = namespace["guards_0_0"](L, G)
        assert verdict == _spelled_out_verdict(L, G), (vars(L["m"]) if hasattr(L["m"], "__dict__") else L["m"], L["x"], G)
        verdicts.add(verdict)
    assert verdicts == {None, *(label for label, _ in CHECKS)}  # every check was the first to fail at least once
    assert "s1 = L['m']" in text and text.count("L['m']") == 1  # shared sources are read once


def test_a_local_is_bound_where_its_source_is_first_read_for_certain():
    rendered = shared_sources([condition for _, condition in CHECKS])
    bindings = [lines for lines, _ in rendered]
    texts = [text for _, text in rendered]
    assert bindings[0] == ["s1 = L['m']"]
    assert bindings[1] == ["s2 = s1.a"] and texts[1] == "type(s2.b) is int and s2.b == 3"  # a.b: this check alone
    # read only if L['x'] is not None: not bound there, though L['m'] (bound) is read from its local
    assert bindings[3] == [] and texts[3] == "L['x'] is None or s1.d.e == 1"
    assert bindings[4] == ["s3 = s1.d"] and texts[4] == "s3.e == 1"
    assert bindings[6] == [] and texts[6] == CHECKS[6][1]  # read by one check alone: spelled out, unchanged
    assert texts[7] == "type(s3.f if isinstance(s3, Box) else s3) is int"


def test_reads_within_one_check_alone_stay_spelled_out():
    condition = "type(L['alpha']) is float and L['alpha'] == 1.0"
    assert shared_sources([condition, "L['beta'] is None"]) == [([], condition), ([], "L['beta'] is None")]


@pytest.mark.parametrize("other", [
    "s1(L['m'].a) is None",  # names a would-be local
    "all(L['m'].a == 2 for L in [L['o']])",  # a comprehension rebinding L (helper-19)
    "L['m'].a == 1 and (lambda L: L['m'].a == 2)(L['o'])",  # a lambda's parameter shadowing L
    "(x := L['m'].a) == 1",
    "\uff53\uff11(L['m'].a) is None",  # fullwidth s1: the parser folds it (NFKC) to the name s1
    "all([L['m'].a == 7for L in [L['o']]])",  # `7for` tokenizes as `7 for` (helper-20)
])
@pytest.mark.filterwarnings("ignore:invalid decimal literal:SyntaxWarning")  # `7for`, as written on purpose
def test_expressions_that_name_a_local_or_bind_a_name_are_left_as_written(other):
    checks = ["L['m'].a == 1", other, "L['m'].a.b == 1"]
    assert shared_sources(checks) == [([], text) for text in checks]


def test_precompile_guards_spells_the_locals_out_again():
    from precompile.artifact.metadata import DynamoFrame

    text = guard_function(_variant(CHECKS), "Frame 0 (fn), variant 0")
    meta = types.SimpleNamespace(frames=(DynamoFrame(name="fn", module="m", variants=1),))
    assert rendered_checks(text, meta)[("fn", 0)] == dict(CHECKS)


def test_a_guard_function_read_again_is_read_from_its_text_and_a_changed_one_anew():
    """The checks of a function whose text the call before read (the other release of a diff) are
    those read then; one check changed in it is read anew, both ways round."""
    from precompile.artifact.metadata import DynamoFrame

    meta = types.SimpleNamespace(frames=(DynamoFrame(name="fn", module="m", variants=1),))
    changed = [(label, check.replace("== 1", "== 7")) for label, check in CHECKS]
    a, b = (guard_function(_variant(checks), "Frame 0 (fn), variant 0") for checks in (CHECKS, changed))
    assert a != b and dict(changed) != dict(CHECKS)
    for text, expected in [(a, CHECKS), (a, CHECKS), (b, changed), (a, CHECKS)]:
        assert rendered_checks(text, meta)[("fn", 0)] == dict(expected)


def test_spelling_out_a_hostile_chain_of_locals_stays_bounded():
    """Locals that chain into text of any length are spelled out only up to a bound; a check reading
    many of them is left as written."""
    lines = ["    s1 = L['m']"] + [f"    s{n} = s{n - 1}.attribute_{n}" for n in range(2, 3000)]
    source = "\n".join(["def guards_0_0(L, G, explain=False):", "    failing = 'X'", "    try:",
                        *("    " + line for line in lines),
                        "        failing = 'DEEP'", "        if not (s2999 is None):", "            return failing",
                        "        failing = 'WIDE'", "        if not ((" + ", ".join(["s20"] * 20000) + ")):", "            return failing",
                        "        failing = 'SHORT'", "        if not (s3.x == 1):", "            return failing",
                        "        s3 = s3.y",  # rebound from itself (helper-19)
                        "        failing = 'REBOUND'", "        if not (s3 == 2):", "            return failing",
                        "        failing = 'SHADOWED'", "        if not ((lambda s3: s3)(2) and [s3 for s3 in s2]):", "            return failing",
                        "        s3000 = L[0x" + "f" * 5000 + "]",  # no str() of it: past the int digits limit
                        "        failing = 'HUGE KEY'", "        if not (s3000 is None):", "            return failing",
                        "        failing = 'HUGE INT'", "        if not (s3.x == 0x" + "f" * 5000 + "):", "            return failing",
                        "    except Exception:", "        return failing"])
    from precompile.artifact.metadata import DynamoFrame

    meta = types.SimpleNamespace(frames=(DynamoFrame(name="fn", module="m", variants=1),))
    checks = rendered_checks(source, meta)[("fn", 0)]
    assert checks["SHORT"] == "L['m'].attribute_2.attribute_3.x == 1"
    assert checks["REBOUND"] == "L['m'].attribute_2.attribute_3.y == 2"
    assert checks["SHADOWED"] == "(lambda s3: s3)(2) and [s3 for s3 in s2]"  # as written
    assert checks["HUGE KEY"] == "s3000 is None" and checks["HUGE INT"].startswith("s3.x == 0xfff")
    # past MAX_SPELLED_OUT characters, a local is named as written, and those bound from it from there
    assert checks["DEEP"].endswith(".attribute_2999 is None") and len(checks["DEEP"]) <= _SpelledOut.MAX_SPELLED_OUT + 20
    assert not checks["DEEP"].startswith("L[")
    assert checks["WIDE"].startswith("(s20, s20") and len(checks["WIDE"]) < 10 * 20000
    assert _SpelledOut.MAX_SPELLED_OUT < 10_000
