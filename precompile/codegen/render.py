"""Render python_code from a render model."""
from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

import msgspec

from precompile.codegen.drivers import source_of
from precompile.codegen.environment import py_literal, render, text_literal
from precompile.codegen.models import MakeFxArtifact, SubgraphSection

# The order metadata literals appear in, so the file reads from what it is to how it is called.
_HEADER_ORDER = ("FORMAT_VERSION", "TRACER", "BACKEND", "SERVING_MODE", "TORCH_VERSION", "PYTHON_VERSION", "FN_NAME")


@dataclass(frozen=True)
class _Section:
    slug: str
    """The section's explicit name, which inspect, extract and diff go by (never derived from the title)."""
    title: str
    body: str = ""
    literals: list[tuple[str, object]] | None = None


_METADATA_TITLE = "Top-level literals. Tools read them with ast and never execute this file."


def _dispatch_state_section() -> _Section:
    return _Section("dispatch-state", "The dispatch key sets a variant's call ran under (inference_mode, autocast), "
                    "which its tensor guards are built under.", source_of("dispatch_state").rstrip("\n"))


def _ordered_literals(metadata) -> list[tuple[str, object]]:
    values = msgspec.to_builtins(metadata)
    if values.get("WORLD", 0) is None:
        del values["WORLD"]  # only an artifact whose graphs call collectives states its world
    if "MODULE_KEYWORDS" in values and not values["MODULE_KEYWORDS"]:
        del values["MODULE_KEYWORDS"]  # only a MakeFx artifact captured with a model passed by keyword states them
    if "SPECIALIZED" in values and not values["SPECIALIZED"]:
        del values["SPECIALIZED"]  # a MakeFx artifact captured before its reads were recorded states none
    for variant in values.get("GUARDS", ()):
        if not variant.get("rendered", True):
            del variant["rendered"]  # only an installed artifact's variants carry their checks as text
        if not variant.get("dispatch_modes", True):
            del variant["dispatch_modes"]  # only an installed variant captured under inference_mode or autocast
    head = [(name, values.pop(name)) for name in _HEADER_ORDER]
    return head + list(values.items())


def _world_sections(metadata) -> list[_Section]:
    """The world check, right after the metadata, for an artifact whose graphs call collectives."""
    if metadata.world is None:
        return []
    check = 'check_world(WORLD, artifact=globals().get("__file__", "this artifact"))'
    return [_Section("world", "The graphs call collectives; this file runs only in the world they were captured in.",
                     source_of("world").rstrip("\n") + "\n\n\n" + check)]


def render_makefx(artifact: MakeFxArtifact) -> str:
    graph = artifact.graph
    sections = [_Section("metadata", _METADATA_TITLE, literals=_ordered_literals(artifact.metadata)),
                *_world_sections(artifact.metadata)]
    if graph.runtime:
        sections.append(_Section("kernel-runtime", "Loads the compiled graph's kernels, primed or JIT.",
                                 source_of(graph.runtime).rstrip("\n")))
    sections.append(_Section("graph", graph.title, graph.source))
    if artifact.autograd_graph is not None:
        sections.append(_Section("autograd-graph", artifact.autograd_graph.title, artifact.autograd_graph.source))
    sections.append(_Section("driver-sources", "Checks the code the trace ran still says what it said at capture.",
                             source_of("source_checks").rstrip("\n")))
    sections.append(_Section("read-checks", "Spells the Python values the trace read, and finds where each call "
                             "reads them again.", source_of("makefx_reads").rstrip("\n")))
    sections.append(_Section("driver", "Checks each call against the metadata, runs the graph, scatters gradients.",
                             source_of("makefx").rstrip("\n")))
    return render(
        "makefx.py.j2",
        what=f"MakeFxTracer, backend={artifact.metadata.backend!r}",
        sections=sections,
        entry=graph.entry,
        # what runs a call autograd records (the autograd-graph section defines it), or None: refused
        autograd_entry=artifact.autograd_graph.entry if artifact.autograd_graph is not None else "None",
        no_autograd=artifact.no_autograd,
    )


# The driver modules lowered subgraphs run on: (slug, title) of the section each is included in.
_SUBGRAPH_RUNTIMES = {
    "inductor_runtime": ("kernel-runtime", "Kernel runtime of the lowered subgraphs: loads their kernels, primed or JIT."),
    "dynamo_subgraphs": ("subgraph-runtime",
                         "Subgraph runtime: runs each output module below and serves its call (no AOTAutograd)."),
}


def _subgraph_sections(subgraphs: list[SubgraphSection]) -> list[_Section]:
    """The runtimes the subgraphs run on (each once, in first use order), then each subgraph's source."""
    runtimes = dict.fromkeys(name for graph in subgraphs for name in graph.runtime)
    return [
        *(_Section(*_SUBGRAPH_RUNTIMES[name], source_of(name).rstrip("\n")) for name in runtimes),
        *(
            _Section(graph.slug, graph.title,
                     graph.source.rstrip("\n") if graph.runs_in_place else f"{graph.name} = {text_literal(graph.source)}")
            for graph in subgraphs
        ),
    ]


def render_dynamo(
    metadata, subgraphs: list[SubgraphSection], state_base64: str, state_sha256: str, state_size: int
) -> str:
    """python_code of a DynamoTracer artifact: metadata, the compiled subgraphs' source, the opaque
    state only torch can give (guard trees, transformed bytecode, AOTAutograd's wrappers), the driver."""
    opaque = "Guard trees and transformed bytecode"
    if any(not graph.runs_in_place for graph in subgraphs):
        opaque += ", and AOTAutograd's wrappers around each subgraph it serves (their output modules are above)"
    sections = [
        _Section("metadata", _METADATA_TITLE, literals=_ordered_literals(metadata)),
        *_world_sections(metadata),
        *_subgraph_sections(subgraphs),
        _Section(
            "opaque-state",
            f"{opaque}, pickled "
            f"({state_size} bytes, sha256 {state_sha256}). Executing this file unpickles it.",
            "_dynamo_state = " + _chunked(state_base64, indent="    ", close=""),
        ),
        _dispatch_state_section(),
        _Section("driver-checks", "Rebuilds each variant's guards from its pickled state, with the by-name checks.",
                 source_of("dynamo_checks").rstrip("\n")),
        _sources_section(),
        _Section("driver", "Rebuilds the guards, seeds the minted names, dispatches each call to a variant.",
                 source_of("dynamo").rstrip("\n")),
    ]
    return render(
        "dynamo.py.j2",
        what=f"DynamoTracer, backend={metadata.backend!r}",
        sections=sections,
        guard_lists=True,
    )


def _sources_section() -> _Section:
    return _Section("driver-sources", "Checks the code Dynamo inlined still says what it said at capture.",
                    source_of("source_checks").rstrip("\n"))


def _chunked(text: str, width: int = 100, indent: str = "        ", close: str = "    ") -> str:
    """A long string literal as a parenthesized run of adjacent literals, one line per chunk."""
    chunks = [text[i : i + width] for i in range(0, len(text), width)] or [""]
    return "(\n" + "\n".join(f"{indent}{chunk!r}" for chunk in chunks) + f"\n{close})"


def render_dynamo_standalone(metadata, subgraphs: list[SubgraphSection], parts, remainder: bytes) -> str:
    """python_code of a standalone DynamoTracer artifact: metadata, the compiled subgraphs' source,
    the marshalled code objects and frame tables, the guards as the code that checks them, what
    stays opaque (labelled, with its reason), the driver."""
    python = f"{metadata.python_version[0]}.{metadata.python_version[1]}"
    blobs = []
    for blob in parts.blobs:
        blobs.append(f"    # {blob.what}: {len(blob.data)} bytes, sha256 {hashlib.sha256(blob.data).hexdigest()}")
        blobs.append(f"    {blob.key!r}: {_chunked(blob.base64)},")
    bytecode = "\n".join([
        f"_dynamo_frames = {py_literal(tuple(parts.frames))}",
        f"_dynamo_defaults = {py_literal(parts.defaults)}",
        "_dynamo_bytecode = {", *blobs, "}",
        "# Where each code object starts in its file (marshalled above as if from line 1: moved code marshals alike).",
        f"_dynamo_first_lines = {py_literal({blob.key: blob.first_line for blob in parts.blobs})}",
    ])
    guards = [f"_dynamo_references = {py_literal(parts.references)}"]
    guards += [variant.source for variant in parts.rendered]
    if remainder:
        encoded = base64.b64encode(remainder).decode("ascii")
        what = []
        if parts.remainder["guards"]:
            count = len(parts.remainder["guards"])
            owner = "1 variant's" if count == 1 else f"{count} variants'"
            what.append(f"{owner} guard state (named in the Guards section)")
        if parts.remainder["backends"]:
            what.append("AOTAutograd's wrappers around each subgraph it serves (their output modules are above)")
        if "defaults" in parts.remainder:
            what.append("fn's defaults, which are not literals")
        opaque = _Section(
            "opaque-remainder", f"{'; '.join(what)}, pickled ({len(remainder)} bytes, sha256 "
            f"{hashlib.sha256(remainder).hexdigest()}). Executing this file unpickles it.",
            "_dynamo_state = " + _chunked(encoded, indent="    ", close=""))
    else:
        opaque = _Section("opaque-remainder", "None: every code object is marshalled above and every guard rendered; "
                          "nothing in this file is pickled.", "_dynamo_state = None")
    sections = [
        _Section("metadata", _METADATA_TITLE, literals=_ordered_literals(metadata)),
        *_world_sections(metadata),
        *_subgraph_sections(subgraphs),
        _Section("bytecode", f"Each frame's original code and each variant's transformed code, marshalled (Python "
                 f"{python} only), Dynamo's minted names renamed to this artifact's; the tables the driver seeds "
                 "and dispatches from.", bytecode),
        _dispatch_state_section(),
        _Section("guard-checks", "Torch's C++ tensor and global-state guards, the helpers the rendered guards use.",
                 source_of("dynamo_guards").rstrip("\n")),
        _Section("guards", "Each variant's kept guards, the checks that run on every call, in order.",
                 "\n\n\n".join(guards)),
        opaque,
        _Section("driver-checks", "Calls each variant's guards as rendered above.",
                 source_of("dynamo_checks").rstrip("\n")),
        _sources_section(),
        _Section("driver", "Seeds the minted names, dispatches each call to the first variant whose guards hold.",
                 source_of("dynamo").rstrip("\n")),
    ]
    return render("dynamo.py.j2", what=f"DynamoTracer, backend={metadata.backend!r}", sections=sections, guard_lists=False)
