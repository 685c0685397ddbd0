"""The house's floor plan, checked from the code: the public names are the intended ones, and the
rooms import each other only along the data flow (capture -> codegen -> artifact on disk -> serve,
with the torch-free artifact and inspect rooms importing neither capture nor serve nor torch), and
inspect's own rooms import one way down (model -> formats, parsing -> verify -> reading -> diff -> render,
beneath its command layer).

Imports are read with ast from every module of the package, lazy ones inside functions included.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import precompile

PACKAGE = Path(precompile.__file__).parent

# room -> the rooms it may import (besides itself and the package's top-level helper modules)
ALLOWED = {
    "artifact": set(),
    "storage": {"artifact"},
    "signing": {"artifact"},
    "inspect": {"artifact", "signing", "storage"},
    "codegen": {"artifact"},
    "serve": {"artifact", "codegen", "signing", "storage"},
    "capturing": {"artifact", "codegen", "serve"},
    "cli": {"artifact", "codegen", "serve", "capturing", "inspect", "signing", "storage", "examples"},
    "testing": {"artifact", "inspect", "serve", "capturing"},
    "examples": set(),
}
TORCH_FREE = {"artifact", "inspect", "signing", "storage"}


def _modules() -> dict[str, ast.Module]:
    return {
        ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _room(module: str) -> str:
    """The room (subpackage) of a dotted module name, or "top" for the package's top-level modules."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else "top"


def _targets(imported: str, names: tuple[str, ...]) -> list[str]:
    """The modules an import reaches: `from precompile import x` reaches precompile.x."""
    return [f"{imported}.{n}" for n in names] if imported == "precompile" else [imported]


def _imports(tree: ast.Module) -> list[tuple[str, tuple[str, ...]]]:
    """(module imported, names taken from it) for every import statement, nested ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


@pytest.fixture(scope="module")
def modules():
    return _modules()


def test_rooms_import_each_other_only_along_the_data_flow(modules):
    wrong = []
    for name, tree in modules.items():
        room = _room(name)
        if room == "top":
            continue
        for imported, names in _imports(tree):
            if imported != "precompile" and not imported.startswith("precompile."):
                continue
            for target in _targets(imported, names):
                target_room = _room(target)
                if target_room not in ("top", room) and target_room not in ALLOWED[room]:
                    wrong.append(f"{name} ({room}) imports {target} ({target_room})")
    assert wrong == []


# inspect's own rooms (its sub-packages) -> the rooms of inspect each may import, as each one's docstring
# says. inspect's top-level modules are the command layer (the CLI verbs, the Python API): they may
# import any room, and no room imports them or the package itself (a climb).
INSPECT_ALLOWED = {
    "model": set(),
    "formats": {"model"},
    "parsing": {"model"},
    "verify": {"model", "formats", "parsing"},
    "reading": {"model", "formats", "parsing", "verify"},
    "diff": {"model", "parsing", "verify", "reading"},
    "render": {"model", "formats", "reading", "diff"},
}
MAX_INSPECT_TOP_MODULES = 10


def _inspect_room(module: str) -> str | None:
    """The room of inspect a dotted module name lies in, "" for its command layer, None outside inspect."""
    parts = module.split(".")
    if parts[:2] != ["precompile", "inspect"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in INSPECT_ALLOWED else ""


def test_inspect_rooms_import_down_one_way(modules):
    wrong = []
    for name, tree in modules.items():
        room = _inspect_room(name)
        if not room:
            continue
        for imported, names in _imports(tree):
            for target in _targets(imported, names):
                target_room = _inspect_room(target)
                if target_room is not None and target_room != room and target_room not in INSPECT_ALLOWED[room]:
                    wrong.append(f"{name} ({room}) imports {target} ({target_room or 'the command layer'})")
    assert wrong == []


def test_inspect_is_a_house_of_declared_rooms_without_cycles(modules):
    """Every sub-package is a declared room with a docstring saying what it owns and may import, the
    rooms' allowances have no cycle, and the command layer stays a handful of modules."""
    rooms = {name.split(".")[2] for name in modules if name.startswith("precompile.inspect.") and name.count(".") == 3}
    assert rooms == set(INSPECT_ALLOWED)
    for room in rooms:
        assert ast.get_docstring(modules[f"precompile.inspect.{room}.__init__"]), room
    placed: list[str] = []
    while len(placed) < len(INSPECT_ALLOWED):
        ready = [room for room, allowed in INSPECT_ALLOWED.items() if room not in placed and allowed <= set(placed)]
        assert ready, f"the rooms {sorted(set(INSPECT_ALLOWED) - set(placed))} allow each other in a cycle"
        placed.extend(ready)
    top = [name for name in modules if name.startswith("precompile.inspect.") and name.count(".") == 2]
    assert len(top) <= MAX_INSPECT_TOP_MODULES, top


def test_the_torch_free_rooms_never_import_torch(modules):
    wrong = [f"{name} imports {target}" for name, tree in modules.items() if _room(name) in TORCH_FREE
             for imported, names in _imports(tree) for target in _targets(imported, names)
             if target == "torch" or target.startswith(("torch.", "precompile.torch_compat"))]
    assert wrong == []


def test_no_private_name_is_imported_across_rooms(modules):
    wrong = []
    for name, tree in modules.items():
        for imported, names in _imports(tree):
            if not imported.startswith("precompile.") or _room(imported) == _room(name):
                continue
            for private in (n for n in names if n.startswith("_") and not n.startswith("__")):
                wrong.append(f"{name} takes {private} from {imported}")
    assert wrong == []


def test_the_public_names_are_the_intended_ones():
    assert sorted(precompile.__all__) == sorted([
        "__version__", "capture", "Capture", "load", "PrecompiledRunnable", "no_compilation", "MakeFxTracer", "DynamoTracer",
        "PrecompileSummary", "PrecompileError", "CaptureRefused", "PairMismatch", "CallMismatch", "CacheFormatError",
        "CompilationForbidden",
        "PrecompileWarning", "distributed",
    ])
    for name in precompile.__all__:
        assert getattr(precompile, name) is not None, name


def test_every_error_a_caller_can_catch_is_a_precompile_error_named_as_the_package_exports_it():
    for name in ("CaptureRefused", "PairMismatch", "CallMismatch", "CacheFormatError", "CompilationForbidden"):
        error = getattr(precompile, name)
        assert issubclass(error, precompile.PrecompileError) and error.__module__ == "precompile", name
    assert issubclass(precompile.PrecompileWarning, UserWarning)


def test_the_package_ships_its_type_information():
    assert (PACKAGE / "py.typed").is_file()


def test_importing_every_module_leaves_the_public_functions_in_place():
    """A room named like a public function would replace it on the package once imported."""
    import importlib
    import pkgutil

    for info in pkgutil.walk_packages(precompile.__path__, "precompile."):
        if info.name != "precompile.__main__":
            importlib.import_module(info.name)
    from precompile.capturing.api import capture
    from precompile.serve.load import load

    assert precompile.capture is capture and precompile.load is load


def test_the_drivers_error_twins_mirror_the_error_hierarchy():
    """python_code's drivers define twins of precompile's errors where the package is not installed:
    each twin has the name and the base of the class it stands in for, and each driver imports
    exactly the names it defines twins of."""
    import precompile.errors as errors

    drivers = PACKAGE / "codegen" / "drivers"
    mirrored = 0
    for path in sorted(drivers.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not (isinstance(node, ast.Try) and isinstance(node.body[0], ast.ImportFrom)
                    and node.body[0].module == "precompile.errors"):
                continue
            imported = {alias.name for alias in node.body[0].names}
            twins = {cls.name: [base.id for base in cls.bases] for cls in node.handlers[0].body if isinstance(cls, ast.ClassDef)}
            assert set(twins) >= imported, path.name
            for name, bases in twins.items():
                real = getattr(errors, name)
                assert bases == [real.__bases__[0].__name__], (path.name, name, bases)
                mirrored += 1
    assert mirrored >= 4


def _module_graph(modules) -> dict[str, set[str]]:
    """module -> the package modules it imports (lazy imports inside functions included)."""
    names = {name.removesuffix(".__init__") for name in modules}
    graph = {}
    for name, tree in modules.items():
        edges = set()
        for imported, taken in _imports(tree):
            if imported == "precompile" or imported.startswith("precompile."):
                for target in [f"{imported}.{n}" for n in taken if f"{imported}.{n}" in names] or [imported]:
                    while target not in names and "." in target:
                        target = target.rsplit(".", 1)[0]
                    edges.add(target)
        graph[name.removesuffix(".__init__")] = edges - {name.removesuffix(".__init__")}
    return graph


def test_the_import_graph_has_no_cycle(modules):
    """No module reaches itself through imports, lazy ones included: each room reads top-down."""
    graph = _module_graph(modules)
    cycles = []
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


# Modules and functions longer than a reader takes in at once, each with the reason it stays whole.
LONG_MODULES = {
    # Pasted into python_code as one driver section, so an artifact's dispatch reads as one served program.
    "precompile.codegen.drivers.dynamo",
}
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def test_no_module_or_function_is_longer_than_a_reader_takes_in(modules):
    long = []
    for name in modules:
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES and name not in LONG_MODULES:
            long.append(f"{name}: {lines} lines")
        for node in ast.walk(modules[name]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == []
