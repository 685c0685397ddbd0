"""Render models: everything a template needs, typed, with no torch objects in them."""
from __future__ import annotations

import msgspec

from precompile.artifact.metadata import ArtifactMetadata


class GraphSection(msgspec.Struct, frozen=True, kw_only=True):
    """The captured graph, realized by a backend, as readable Python source."""

    title: str
    source: str
    """Defines `entry` (see below) and whatever it needs."""
    entry: str
    """Name of the callable `run_graph(*params, *buffers, *tensor_inputs) -> flat outputs`."""
    runtime: str | None = None
    """A driver module (codegen/drivers) the graph's source needs, included just before it."""


class MakeFxArtifact(msgspec.Struct, frozen=True, kw_only=True):
    metadata: ArtifactMetadata
    graph: GraphSection
    autograd_graph: GraphSection | None = None
    """What runs the calls autograd records (grad mode on, a tensor requiring grad), rendered as the
    section `autograd-graph`: the eager backend's graph itself, or the ATen graph beside a compiled
    one. None: such calls are refused (a training step's graph computes its gradients itself)."""
    no_autograd: tuple[str, bool] | None = None
    """Why there is no autograd graph for a forward (fn's code shapes autograd in a way its graph does
    not keep, or dims marked unbacked), and whether eager's result carries autograd in any grad mode."""


class SubgraphSection(msgspec.Struct, frozen=True, kw_only=True):
    """A compiled Dynamo subgraph's lowered source, bound to `name` in python_code."""

    title: str
    slug: str
    """The section's name in python_code (`graph-0`, `graph-0-forward`), what inspect and diff go by."""
    name: str
    source: str
    runs_in_place: bool
    """True: `source` is code that defines `name` (eager ATen, lowered Inductor). False: `source` is an
    output module AOTAutograd loads itself, bound to `name` as a string (Inductor's fallback)."""
    runtime: tuple[str, ...] = ()
    """Driver modules (codegen/drivers) `source` runs on, included once before the first subgraph."""


class AutogradPlan(msgspec.Struct, frozen=True, kw_only=True):
    """How a training subgraph's forward and backward output modules pass values (see the
    dynamo_subgraphs driver's autograd_subgraph)."""

    returns: int
    saved_tensors: int
    non_differentiable: tuple[int, ...]
    grad_outputs: tuple[int, ...]


class Realignment(msgspec.Struct, frozen=True, kw_only=True):
    """The inputs an output module's GPU kernels were compiled to take 16-byte aligned and whose check
    its own code does not make (see the inductor_runtime driver's run_inductor_call). Empty on a CPU."""

    inputs: tuple[int, ...] = ()
    write_back: tuple[int, ...] = ()
    """Of `inputs`, those the module writes into: a copy made to align one is copied back after."""
    written: tuple[int, ...] = ()
    """Every input the module writes into (on any device): its version counter is bumped after the call."""
