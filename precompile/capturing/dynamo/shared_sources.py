"""The guard sources a guard function reads more than once, each read once into a local.

Dynamo's sources are access paths (`L['model']._modules['encoder']._modules['layer']._modules['0']`),
and one variant's checks read the same paths over and over: a module's type, its dict's keys, its
hooks, the attributes of each parameter. Spelled out whole each time, they made most of a large
model's guard function, which load unmarshals and the first call runs. Here every path (or path
prefix) that more than one check reads, or that longer paths branch from, is bound to a local `sN`
and read from it after.

A local is bound where the path is first read for certain: in check order, the first check that
reads it outside the right operand of `and`/`or`, an if-expression's branches, a comprehension's
element and conditions, and the comparisons after the first of a chained comparison. It is bound
right after that check's label, so a source that is not there fails the same check as when spelled
out. Reads before that point (only conditional ones) stay spelled out. Each source is read once per
call, as torch's own guard manager reads each accessor once: the checks have no side effects, and a
property that answers differently on a second read is read once. Expressions that bind a name of
their own (a lambda, `:=`, a comprehension over L or G) are left as they are, all of them.
"""
from __future__ import annotations

import ast
import re

_ROOTS = frozenset({"L", "G"})
_LOCAL = "s{}"
_TAKEN = re.compile(r"s\d+")
_MAY_REBIND = re.compile(r"(?<![A-Za-z_])(?:s\d+|lambda|for)\b|:=")  # a digit may come first: `7for` is `7 for`
"""ASCII text that may name a would-be local or bind a name (what _names_or_rebinds looks for in the
tree); an ASCII expression without any is not walked (identifiers in other text may fold to one)."""


def _is_path(node: ast.AST) -> bool:
    """An access path from L or G: constant subscripts and attributes down to the name, at least one."""
    if not isinstance(node, (ast.Subscript, ast.Attribute)):
        return False
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Constant):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id in _ROOTS


def _prefixes(node: ast.AST) -> list[ast.Attribute | ast.Subscript]:
    """The path's nodes, shortest first (its root name left out)."""
    chain: list[ast.Attribute | ast.Subscript] = []
    while isinstance(node, (ast.Subscript, ast.Attribute)):
        chain.append(node)
        node = node.value
    return chain[::-1]


def _keys(path: ast.AST) -> list[str]:
    """The text of each of the path's prefixes, shortest first, as `ast.unparse` writes them."""
    chain = _prefixes(path)
    root = chain[0].value
    assert isinstance(root, ast.Name)  # _is_path
    text = root.id
    keys = []
    for node in chain:
        text += f".{node.attr}" if isinstance(node, ast.Attribute) else f"[{node.slice.value!r}]"  # type: ignore[attr-defined]
        keys.append(text)
    return keys


def _reads(node: ast.AST, certain: bool, out: list[tuple[ast.AST, bool]]) -> None:
    """Every path read in `node`, in evaluation order, each with whether it is read on every run."""
    if _is_path(node):
        out.append((node, certain))
        return
    for child, runs in _children(node):
        _reads(child, certain and runs, out)


def _children(node: ast.AST) -> list[tuple[ast.AST, bool]]:
    """`node`'s children in evaluation order, each with whether it runs whenever `node` does."""
    if isinstance(node, ast.BoolOp):
        return [(value, index == 0) for index, value in enumerate(node.values)]
    if isinstance(node, ast.IfExp):
        return [(node.test, True), (node.body, False), (node.orelse, False)]
    if isinstance(node, ast.Compare):
        return [(node.left, True), *((comparator, index == 0) for index, comparator in enumerate(node.comparators))]
    if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
        first = node.generators[0].iter
        return [(first, True),
                *((child, False) for child in ast.iter_child_nodes(node) if not isinstance(child, ast.comprehension)),
                *((child, False) for generator in node.generators for child in ast.iter_child_nodes(generator)
                  if child is not first)]
    if isinstance(node, ast.Lambda):
        return []
    return [(child, True) for child in ast.iter_child_nodes(node)]


class _FromLocals(ast.NodeTransformer):
    """Reads each path from the local of its longest prefix bound so far."""

    def __init__(self, bound: dict[str, str]) -> None:
        self.bound = bound

    def visit(self, node: ast.AST) -> ast.AST:
        if _is_path(node):
            return self.replaced(node)
        return super().visit(node)

    def replaced(self, node: ast.AST, proper: bool = False) -> ast.AST:
        """`node` with its longest bound prefix (`proper`: shorter than itself) read from its local."""
        chain, keys = _prefixes(node), _keys(node)
        for depth in range(len(chain) - proper, 0, -1):
            name = self.bound.get(keys[depth - 1])
            if name is not None:
                return _rebased(node, chain[depth - 1], ast.Name(id=name, ctx=ast.Load()))
        return node


def _rebased(node: ast.AST, prefix: ast.AST, name: ast.Name) -> ast.AST:
    """A copy of path `node` whose `prefix` node is replaced by `name`."""
    if node is prefix:
        return name
    assert isinstance(node, (ast.Attribute, ast.Subscript))  # a path's node
    return type(node)(**{**{field: getattr(node, field) for field in node._fields}, "value": _rebased(node.value, prefix, name)})


def _shared(reads: list[list[tuple[ast.AST, bool]]], keys_of: dict[int, list[str]]) -> tuple[dict[str, int], set[str]]:
    """Per path prefix (its text), the first check that reads it for certain, where it would be bound;
    and the prefixes worth binding: from there on read whole by two checks or more, or the start of
    two longer paths or more. Reads within one check alone stay spelled out (`type(L['x']) is float
    and L['x'] == 1.0` reads better than through a local)."""
    first_certain: dict[str, int] = {}
    for index, found in enumerate(reads):
        for path, certain in found:
            for key in keys_of[id(path)] if certain else ():
                first_certain.setdefault(key, index)
    uses: dict[str, set] = {}
    for index, found in enumerate(reads):
        for path, _ in found:
            keys = keys_of[id(path)]
            for key, extended in zip(keys, [*keys[1:], index]):
                if first_certain.get(key, index + 1) <= index:
                    uses.setdefault(key, set()).add(extended)
    return first_certain, {key for key, used in uses.items() if len(used) >= 2}


def _names_or_rebinds(node: ast.AST) -> bool:
    """Whether `node` names a would-be local (`s1`), or binds a name inside the expression (a
    comprehension's target, a lambda's parameter, `:=`), which could shadow L, G or a local."""
    if isinstance(node, ast.Name):
        return bool(_TAKEN.fullmatch(node.id)) or isinstance(node.ctx, ast.Store) and node.id in _ROOTS
    return isinstance(node, (ast.Lambda, ast.NamedExpr)) or isinstance(node, ast.comprehension) and any(
        isinstance(target, ast.Name) and target.id in _ROOTS for target in ast.walk(node.target))


def shared_sources(expressions: list[str]) -> list[tuple[list[str], str]]:
    """For each expression of a guard function, in the order they run: the `sN = path` lines to run
    just before it, and its text reading each bound path from its local (unchanged where none is)."""
    trees = [ast.parse(text, mode="eval").body for text in expressions]
    if any(_names_or_rebinds(node) for text, tree in zip(expressions, trees)
           if not text.isascii() or _MAY_REBIND.search(text) for node in ast.walk(tree)):
        return [([], text) for text in expressions]
    reads = []
    for tree in trees:
        found: list[tuple[ast.AST, bool]] = []
        _reads(tree, True, found)
        reads.append(found)
    keys_of = {id(path): _keys(path) for found in reads for path, _ in found}
    first_certain, shared = _shared(reads, keys_of)
    bound: dict[str, str] = {}
    rendered = []
    for index, (text, tree, found) in enumerate(zip(expressions, trees, reads)):
        binding = _FromLocals(bound)
        lines = []
        for path, _ in found:
            for node, key in zip(_prefixes(path), keys_of[id(path)]):
                if key in shared and key not in bound and first_certain[key] == index:
                    value = ast.unparse(binding.replaced(node, proper=True))
                    bound[key] = _LOCAL.format(len(bound) + 1)
                    lines.append(f"{bound[key]} = {value}")
        uses_locals = any(key in bound for path, _ in found for key in keys_of[id(path)])
        rendered.append((lines, ast.unparse(binding.visit(tree)) if uses_locals else text))
    return rendered
