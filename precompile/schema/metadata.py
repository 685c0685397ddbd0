"""The python_code header: top-level literal assignments, typed.

python_code states its own calling convention in `NAME = <literal>` lines at the top of the file.
Tools read them with `ast` (see `pycode`), never by executing the file, and convert them into the
Struct of the artifact's tracer. Field `foo_bar` is the literal `FOO_BAR`.
"""
from __future__ import annotations

from typing import Literal, Union

import msgspec

from precompile.schema.envelope import Backend

# A constant leaf of an input or output: what a Python literal can hold and compare by value.
ConstantValue = Union[None, bool, int, float, str]


class UnbackedDim(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A dim marked with mark_unbacked: any size (within min/max), equal across dims sharing `symbol`."""

    symbol: str
    """The traced size symbol; dims marked with one shape_id share it and must be equal at runtime."""
    shape_id: str | None = None
    min: int | None = None
    max: int | None = None


class TensorLeaf(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="tensor", tag_field="kind"):
    """A tensor leaf of the flattened inputs or outputs, specialized on shape, dtype and device."""

    path: str
    """Where the leaf sits in fn's arguments or result, e.g. "args[1]['mask']" or "result[0]"."""
    shape: tuple[int | None, ...]
    """None marks a dim that may take any size (mark_unbacked)."""
    dtype: str
    device: str
    stride: tuple[int | None, ...] | None = None
    """Set where the backend specializes on memory layout (inductor); None marks a free stride."""
    unbacked: dict[int, UnbackedDim] | None = None
    """The dims marked with mark_unbacked, by index (their `shape` entry is None)."""


class ConstantLeaf(msgspec.Struct, frozen=True, kw_only=True, tag="constant", tag_field="kind"):
    """A non-tensor leaf, baked into the trace: inputs must pass the same value again."""

    path: str
    value: ConstantValue


Leaf = Union[TensorLeaf, ConstantLeaf]


class NamedTensor(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A parameter or buffer of the nn.Module arguments, lifted to a graph input."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    stride: tuple[int, ...] | None = None
    """Set where the backend specializes on memory layout (inductor)."""


class ArtifactHeader(msgspec.Struct, frozen=True, kw_only=True, rename="upper"):
    """What every python_code states, whatever its tracer."""

    format_version: int
    backend: Backend
    serving_mode: Literal["standalone", "installed"] = "standalone"
    torch_version: str
    python_version: tuple[int, int]
    fn_name: str


class MakeFxMetadata(ArtifactHeader, frozen=True, kw_only=True, tag="make_fx", tag_field="TRACER"):
    """The calling convention of a MakeFxTracer artifact."""

    num_positional_args: int
    module_positions: tuple[int, ...]
    params: tuple[NamedTensor, ...]
    """Parameters of the module arguments, in order; a tied weight appears once, under its first name."""
    buffers: tuple[NamedTensor, ...]
    in_spec: str
    """pytree spec (treespec_dumps) of the positional args with every module replaced by None."""
    inputs: tuple[Leaf, ...]
    out_spec: str
    outputs: tuple[Leaf, ...]
    grad_param_indices: tuple[int, ...]
    """Indices into `params` whose gradients the graph returns after fn's outputs."""


# Every metadata layout a reader understands, told apart by the TRACER literal.
ArtifactMetadata = MakeFxMetadata
