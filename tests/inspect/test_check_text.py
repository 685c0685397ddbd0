"""check_text writes a rendered guard's check exactly as ast.unparse writes it (each local bound to a
path written as its path), or leaves it to the unparser."""
from __future__ import annotations

import ast
import types

from hypothesis import example, given, settings
from hypothesis import strategies as st

from precompile.inspect.parsing import check_text, rendered_guards
from property_budget import examples

PATHS = {"s1": "L['model']", "s2": "L['model']._modules['features']", "s3": "G['torch'].float32"}
NAMES = st.sampled_from(["s1", "s2", "s3", "s4", "L", "len", "type", "___check_obj_id"])
LITERALS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=0, max_value=2**70), st.floats(allow_nan=False),
    st.text(max_size=6), st.binary(max_size=3),
)


def _expressions():
    leaves = st.one_of(NAMES.map(lambda name: ast.Name(id=name, ctx=ast.Load())), LITERALS.map(lambda v: ast.Constant(value=v)))

    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(["_modules", "training", "real"])).map(lambda t: ast.Attribute(value=t[0], attr=t[1], ctx=ast.Load())),
            st.tuples(inner, inner).map(lambda t: ast.Subscript(value=t[0], slice=t[1], ctx=ast.Load())),
            st.tuples(inner, st.lists(inner, max_size=3), st.booleans()).map(lambda t: ast.Call(
                func=t[0], args=t[1], keywords=[ast.keyword(arg="k", value=t[0])] if t[2] else [])),
            st.tuples(inner, st.lists(st.tuples(st.sampled_from(list(check_text._OPERATORS)), inner), min_size=1, max_size=3)).map(
                lambda t: ast.Compare(left=t[0], ops=[op() for op, _ in t[1]], comparators=[c for _, c in t[1]])),
            st.tuples(inner, inner).map(lambda t: ast.BoolOp(op=ast.And(), values=list(t))),
            inner.map(lambda operand: ast.UnaryOp(op=ast.Not(), operand=operand)),
            inner.map(lambda element: ast.Tuple(elts=[element], ctx=ast.Load())),
        )

    return st.recursive(leaves, extend, max_leaves=12)


@settings(max_examples=examples(400), deadline=None)
@given(_expressions())
@example(ast.Subscript(value=ast.Name(id="s1", ctx=ast.Load()), slice=ast.Name(id="s2", ctx=ast.Load()), ctx=ast.Load()))
@example(ast.Call(func=ast.Name(id="s1", ctx=ast.Load()), args=[ast.Name(id="s2", ctx=ast.Load())], keywords=[]))
def test_what_it_writes_is_what_the_unparser_writes(test):
    ast.fix_missing_locations(test)
    try:
        fast, used = check_text.written(test, PATHS, 10_000)
    except check_text.Unwritten:
        return
    writer = rendered_guards._PathWriter(PATHS, 10_000)
    assert fast == writer.visit(test)
    assert used == writer.names


def test_the_paths_it_writes_are_bounded():
    test = ast.parse("f(s2, s2, s2)", mode="eval").body
    try:
        check_text.written(test, PATHS, 2 * len(PATHS["s2"]))
    except check_text.TooLong:
        pass
    else:
        raise AssertionError("three paths written within the length of two")


DYNAMO_CHECKS = [  # as Dynamo writes them (densenet121's guards, among others)
    ("ID_MATCH model", "___check_obj_id(L['model'], 140234817)"),
    ("NN_MODULE model.features", "len(L['model']._modules['features']._forward_hooks) == 0"),
    ("CONSTANT_MATCH model.training", "L['model'].training == True"),
    ("NONE_MATCH bias", "L['model']._modules['features']._modules['conv0']._parameters['bias'] is None"),
    ("TYPE_MATCH args", "type(L['args']) is _by_name['builtins:tuple']"),
    ("LENGTH_CHECK args", "len(L['args']) == 2"),
    ("HASATTR model (mode)", "hasattr(L['model'], 'mode')"),
    ("EQUALS_MATCH mode", "L['model'].mode == 'a'"),
    ("DICT_KEYS", "list(L['model']._modules.keys()) == ['features', 'classifier']"),
    ("ESCAPED", "L['model'].name != 'it\\'s'"),
    ("EITHER", "L['x'] is None or L['model'].d.e == 1"),
    ("NEGATED", "not L['model'].frozen"),
]


def test_dynamos_checks_read_as_the_unparser_reads_them(monkeypatch):
    from precompile.artifact.metadata import DynamoFrame
    from precompile.capturing.dynamo.guard_function import guard_function

    variant = types.SimpleNamespace(prefix="0_0", global_state=None, tensors=(), tensor_sources=(), lines=DYNAMO_CHECKS,
                                    aliasing=(), marking=(), notes=[], origins={})
    text = guard_function(variant, "Frame 0 (fn), variant 0")
    meta = types.SimpleNamespace(frames=(DynamoFrame(name="fn", module="m", variants=1),))
    monkeypatch.setattr(rendered_guards, "_last_functions", {})
    fast = rendered_guards.rendered_checks(text, meta)
    taken = []

    def unwritten(*args):
        taken.append(args)
        raise check_text.Unwritten

    monkeypatch.setattr(rendered_guards, "_last_functions", {})
    monkeypatch.setattr(check_text, "written", unwritten)
    unparsed = {label: ast.unparse(ast.parse(check)) for label, check in DYNAMO_CHECKS}  # 'it\\'s' is written "it's"
    assert fast == rendered_guards.rendered_checks(text, meta) == {("fn", 0): unparsed}
    assert len(taken) >= 8  # the locals were spelled out by both


def test_tensor_rows_name_an_inference_tensor_and_the_modes_its_keys_were_read_under():
    """The keywords a variant captured under inference_mode or autocast renders are read as literals;
    anything else in their place reads as their absence, never as an error."""
    row = "('x', 'torch:Tensor', 'torch.float32', 'cpu', False, (2, 4), (4, 1))"
    source = (f"_tensors_0_0 = _TensorMatch(({row}, {row.replace('x', 'y')}), inference=(1,), modes=('inference_mode',))\n"
              f"_tensors_0_1 = _TensorMatch(({row},), inference=open('x'), modes=(1,))\n"
              f"_tensors_0_2 = _TensorMatch(({row},))\n")
    rows = rendered_guards.tensor_rows(source)
    assert rows[(0, 0)]["x"].endswith("requires_grad=False, keys read under inference_mode")
    assert rows[(0, 0)]["y"].endswith("requires_grad=False, an inference tensor, keys read under inference_mode")
    assert rows[(0, 1)]["x"] == rows[(0, 2)]["x"] == "Tensor torch.float32 on cpu, size (2, 4), stride (4, 1), requires_grad=False"
