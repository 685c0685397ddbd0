"""Render python_code from a render model."""
from __future__ import annotations

import msgspec

from precompile.codegen.drivers import source_of
from precompile.codegen.environment import render
from precompile.codegen.models import MakeFxArtifact

# The order metadata literals appear in, so the file reads from what it is to how it is called.
_HEADER_ORDER = ("FORMAT_VERSION", "TRACER", "BACKEND", "SERVING_MODE", "TORCH_VERSION", "PYTHON_VERSION", "FN_NAME")


def _ordered_literals(metadata) -> list[tuple[str, object]]:
    values = msgspec.to_builtins(metadata)
    head = [(name, values.pop(name)) for name in _HEADER_ORDER]
    return head + list(values.items())


def render_makefx(artifact: MakeFxArtifact) -> str:
    return render(
        "makefx.py.j2",
        what=f"MakeFxTracer, backend={artifact.metadata.backend!r}",
        literals=_ordered_literals(artifact.metadata),
        graph=artifact.graph,
        driver_source=source_of("makefx").rstrip("\n"),
    )
