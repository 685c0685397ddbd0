"""The one door to torch's private names (precompile/serve/torch_compat.py) and what it promises."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import precompile
from precompile.errors import PrecompileError
from precompile.serve import no_compilation as no_compilation_module
from precompile import torch_compat

RUNTIME = Path(precompile.__file__).parent / "runtime"
DRIVERS = Path(precompile.__file__).parent / "codegen" / "drivers"


def _private(dotted: str) -> bool:
    """torch.a._b..., any component after `torch` private (dunders like __version__ are public)."""
    parts = dotted.split(".")
    return parts[0] == "torch" and any(p.startswith("_") and not p.endswith("__") for p in parts[1:])


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_torch_references(source: str) -> list[tuple[int, str]]:
    """(line, name) of every private torch name a module imports or reaches by an attribute chain."""
    tree = ast.parse(source)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names if _private(f"{node.module}.{a.name}")]
        elif isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = _dotted(node)
            if dotted and _private(dotted):
                found.append((node.lineno, dotted))
    return sorted(set(found))


def test_the_reference_finder_catches_each_way_of_reaching_a_private_name():
    source = "import torch._dynamo\nfrom torch._inductor import config\nfrom torch.fx.graph import _custom_builtins\n" \
        "x = torch._C._dynamo.guards\nimport torch.utils._pytree as p\nok = torch.__version__ + torch.nn.Linear"
    names = [name for _, name in private_torch_references(source)]
    assert "torch._dynamo" in names and "torch._inductor.config" in names and "torch.fx.graph._custom_builtins" in names
    assert "torch._C._dynamo.guards" in names and "torch.utils._pytree" in names
    assert not any("__version__" in n or "nn.Linear" in n for n in names)


def test_runtime_modules_reach_private_torch_names_only_through_torch_compat():
    offenders = []
    for path in sorted(RUNTIME.rglob("*.py")):
        if path.name == "torch_compat.py":
            continue
        for line, name in private_torch_references(path.read_text(encoding="utf-8")):
            offenders.append(f"{path.relative_to(RUNTIME.parent.parent)}:{line}: {name}")
    assert not offenders, (
        "these runtime modules reach a private torch name directly; add it to torch_compat.PRIVATE_NAMES "
        "(with _MOVED entries where a torch version keeps it elsewhere) and import it from "
        "precompile.torch_compat instead:\n" + "\n".join(offenders)
    )


@pytest.mark.parametrize("name", sorted(torch_compat.PRIVATE_NAMES))
def test_every_private_name_resolves_on_this_torch(name):
    assert torch_compat.resolve(torch_compat.where(name)) is not None


def test_every_no_compilation_gate_target_exists_on_this_torch():
    assert torch_compat.missing_gates() == []


def test_a_missing_name_fails_loudly_naming_the_torch_version_and_the_name(monkeypatch):
    with pytest.raises(PrecompileError, match=rf"torch {re.escape(torch.__version__)} has no torch\._inductor\.no_such_thing"):
        torch_compat.resolve("torch._inductor.no_such_thing")
    with pytest.raises(PrecompileError, match=r"has no torch\._dynamo\.package\.NoSuchClass.*2\.11 to 2\.15"):
        torch_compat.resolve("torch._dynamo.package:NoSuchClass")
    with pytest.raises(AttributeError):
        torch_compat.not_a_runtime_name  # noqa: B018


def test_no_compilation_refuses_a_torch_that_lacks_a_gate_target(monkeypatch):
    monkeypatch.setattr(no_compilation_module, "_hook_installed", False)
    monkeypatch.setattr(no_compilation_module, "missing_gates", lambda: ["torch._inductor.graph.GraphLowering.compile_to_module"])
    with pytest.raises(PrecompileError, match=r"cannot guard this torch .*GraphLowering\.compile_to_module"):
        with precompile.no_compilation():
            pass
    assert not no_compilation_module.active()


def test_missing_gates_reads_sources_and_finds_a_renamed_target(monkeypatch):
    gates = dict(torch_compat.NO_COMPILATION_GATES)
    gates["torch._inductor.graph"] = (("GraphLowering.no_such_method", "x"),)
    monkeypatch.setattr(torch_compat, "NO_COMPILATION_GATES", gates)
    assert torch_compat.missing_gates() == ["torch._inductor.graph.GraphLowering.no_such_method"]


def _driver_table(path: Path) -> dict[str, str] | None:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_TORCH_PRIVATE"]:
            return ast.literal_eval(node.value)
    return None


def test_driver_private_name_tables_match_torch_compat():
    """Drivers run standalone and cannot import torch_compat: their copies must say the same."""
    tables = {p.stem: t for p in sorted(DRIVERS.glob("*.py")) if (t := _driver_table(p)) is not None}
    assert tables == torch_compat.DRIVER_NAMES
    for table in tables.values():
        assert {name: torch_compat.PRIVATE_NAMES.get(name) for name in table} == table
