"""Render models: everything a template needs, typed, with no torch objects in them."""
from __future__ import annotations

import msgspec

from precompile.schema.metadata import ArtifactMetadata


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
