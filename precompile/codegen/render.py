"""Render python_code from a render model."""
from __future__ import annotations

from dataclasses import dataclass

import msgspec

from precompile.codegen.drivers import source_of
from precompile.codegen.environment import render, text_literal
from precompile.codegen.models import MakeFxArtifact, SubgraphSection

# The order metadata literals appear in, so the file reads from what it is to how it is called.
_HEADER_ORDER = ("FORMAT_VERSION", "TRACER", "BACKEND", "SERVING_MODE", "TORCH_VERSION", "PYTHON_VERSION", "FN_NAME")


@dataclass(frozen=True)
class _Section:
    title: str
    body: str = ""
    literals: list[tuple[str, object]] | None = None


def _ordered_literals(metadata) -> list[tuple[str, object]]:
    values = msgspec.to_builtins(metadata)
    if values.get("WORLD", 0) is None:
        del values["WORLD"]  # only an artifact whose graphs call collectives states its world
    head = [(name, values.pop(name)) for name in _HEADER_ORDER]
    return head + list(values.items())


def _world_sections(metadata) -> list[_Section]:
    """The world check, right after the metadata, for an artifact whose graphs call collectives."""
    if metadata.world is None:
        return []
    check = 'check_world(WORLD, artifact=globals().get("__file__", "this artifact"))'
    return [_Section("World: the graphs call collectives; this file runs only in the world they were captured in.",
                     source_of("world").rstrip("\n") + "\n\n\n" + check)]


def render_makefx(artifact: MakeFxArtifact) -> str:
    graph = artifact.graph
    sections = [_Section("Metadata: top-level literals. Tools read them with ast and never execute this file.",
                         literals=_ordered_literals(artifact.metadata)), *_world_sections(artifact.metadata)]
    if graph.runtime:
        sections.append(_Section("Kernel runtime of the compiled graph: loads its kernels, primed or JIT.",
                                 source_of(graph.runtime).rstrip("\n")))
    sections.append(_Section(graph.title, graph.source))
    sections.append(_Section("Driver: checks each call against the metadata, runs the graph, scatters gradients.",
                             source_of("makefx").rstrip("\n")))
    return render(
        "makefx.py.j2",
        what=f"MakeFxTracer, backend={artifact.metadata.backend!r}",
        sections=sections,
        entry=graph.entry,
    )


_RUNTIME_TITLES = {
    "inductor_runtime": "Kernel runtime of the lowered subgraphs: loads their kernels, primed or JIT.",
    "dynamo_subgraphs": "Subgraph runtime: runs each output module below and serves its call (no AOTAutograd).",
}


def render_dynamo(
    metadata, subgraphs: list[SubgraphSection], state_base64: str, state_sha256: str, state_size: int
) -> str:
    """python_code of a DynamoTracer artifact: metadata, the compiled subgraphs' source, the opaque
    state only torch can give (guard trees, transformed bytecode, AOTAutograd's wrappers), the driver."""
    width = 100
    chunks = [state_base64[i : i + width] for i in range(0, len(state_base64), width)] or [""]
    opaque = "guard trees and transformed bytecode"
    if any(not graph.runs_in_place for graph in subgraphs):
        opaque += ", and AOTAutograd's wrappers around each subgraph it serves (their output modules are above)"
    runtimes = dict.fromkeys(name for graph in subgraphs for name in graph.runtime)
    sections = [
        _Section("Metadata: top-level literals. Tools read them with ast and never execute this file.",
                 literals=_ordered_literals(metadata)),
        *_world_sections(metadata),
        *(_Section(_RUNTIME_TITLES[name], source_of(name).rstrip("\n")) for name in runtimes),
        *(
            _Section(graph.title, graph.source.rstrip("\n") if graph.runs_in_place else f"{graph.name} = {text_literal(graph.source)}")
            for graph in subgraphs
        ),
        _Section(
            f"Opaque state: {opaque}, pickled "
            f"({state_size} bytes, sha256 {state_sha256}). Executing this file unpickles it.",
            "_dynamo_state = (\n" + "\n".join(f"    {chunk!r}" for chunk in chunks) + "\n)",
        ),
        _Section("Driver: rebuilds the guards, seeds the minted names, dispatches each call to a variant.",
                 source_of("dynamo").rstrip("\n")),
    ]
    return render(
        "dynamo.py.j2",
        what=f"DynamoTracer, backend={metadata.backend!r}",
        sections=sections,
    )
