"""Realize a traced graph with a backend, as readable source for python_code's graph section."""
from __future__ import annotations

import re

import torch
from torch.fx.graph import _custom_builtins

from precompile.codegen.models import GraphSection
from precompile.errors import PrecompileError

ENTRY = "captured_graph"


def lower_eager(graph_module: torch.fx.GraphModule) -> GraphSection:
    """The captured ATen graph as a plain Python function over the flat graph inputs."""
    code = graph_module.graph.python_code(root_module="self")
    imports = []
    for name in code.globals:
        if not re.search(rf"\b{re.escape(name)}\b", code.src):
            continue  # FX offers a fixed set of globals; import only those the graph uses
        builtin = _custom_builtins.get(name)
        if builtin is None:
            raise PrecompileError(f"the captured graph refers to {name!r}, which the eager backend cannot render as source")
        imports.append(builtin.import_str)
    imports.sort()
    source, count = re.subn(r"def forward\(self(, )?", f"def {ENTRY}(", code.src.strip("\n"), count=1)
    if count != 1:
        raise PrecompileError("the captured graph's source has no forward(self, ...) to render")
    body = "\n".join(line.rstrip() for line in source.splitlines())
    return GraphSection(title="Captured graph (eager backend: ATen ops, run as they are)", source="\n".join(imports) + "\n\n\n" + body, entry=ENTRY)
