"""Dims marked with torch._dynamo.decorators.mark_unbacked: traced as unbacked symbols, so one
artifact serves any runtime size of them.

Fake inputs are made here, with a ShapeEnv, before make_fx runs: a marked dim becomes a fresh
unbacked symbol and every other dim stays static. A graph that needs to guard on a marked dim
fails to trace, which the tracer reports as a refusal.
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

from precompile.artifact.metadata import UnbackedDim
from precompile.errors import CaptureRefused
from precompile.torch_compat import FakeTensorMode, check


def marked_dims(tensor: torch.Tensor) -> frozenset[int]:
    return frozenset(getattr(tensor, "_dynamo_unbacked_indices", ()) or ())


def refuse_unsupported_marks(path: str, tensor: torch.Tensor, *, allow_unbacked: bool) -> None:
    """Refuse the dim markings a MakeFx artifact cannot honour, naming the tensor and the remedy."""
    if getattr(tensor, "_dynamo_dynamic_indices", None):
        raise CaptureRefused(
            f"{path} has dims marked with mark_dynamic (backed dynamic shapes), which MakeFxTracer does not "
            "support; mark them with torch._dynamo.decorators.mark_unbacked instead"
        )
    dims = marked_dims(tensor)
    if not dims:
        return
    if not allow_unbacked:
        raise CaptureRefused(
            f"{path} has dims {sorted(dims)} marked with mark_unbacked, which only backend='inductor' supports "
            "(the eager backend replays a graph specialized to one shape); capture with backend='inductor'"
        )
    if getattr(tensor, "_dynamo_hint_overrides", None):
        raise CaptureRefused(
            f"{path} was marked with mark_unbacked(..., hint_override=...), which precompile does not support yet; "
            "mark the dim without it"
        )
    if any((getattr(tensor, "_specialize_on", None) or {}).values()):  # {dim: [specializations]}
        raise CaptureRefused(f"{path} was marked with mark_unbacked(..., specialize_on=...), which precompile does not support")


def fake_inputs(tensors: list[torch.Tensor]) -> tuple[FakeTensorMode, list[torch.Tensor]]:
    """Fakes of `tensors` in one FakeTensorMode, marked dims as unbacked symbols, the rest static.

    Dims marked with one shape_id share a symbol, and min/max bound it, through torch._check.
    """
    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    fakes = []
    for tensor in tensors:
        dims = marked_dims(tensor)
        context: StatelessSymbolicContext[..., object] = StatelessSymbolicContext(
            dynamic_sizes=[DimDynamic.UNBACKED if i in dims else DimDynamic.STATIC for i in range(tensor.dim())]
        )
        fakes.append(mode.from_tensor(tensor.detach(), symbolic_context=context))
    first_of_shape_id: dict = {}
    with mode:
        for tensor, fake in zip(tensors, fakes):
            for dim in sorted(marked_dims(tensor)):
                size = fake.shape[dim]
                shape_id = (getattr(tensor, "_dynamo_shape_ids", None) or {}).get(dim)
                if shape_id is not None:
                    check(size == first_of_shape_id.setdefault(shape_id, size))
                low, high = (getattr(tensor, "_dynamo_unbacked_bounds", None) or {}).get(dim, (None, None))
                if low is not None:
                    check(size >= low)
                if high is not None:
                    check(size <= high)
    mode.shape_env.pending_fresh_unbacked_symbols.clear()
    return mode, fakes


def described_dims(tensor: torch.Tensor, fake: torch.Tensor) -> dict[int, UnbackedDim] | None:
    """The metadata of `tensor`'s marked dims, named by the symbols they were traced as."""
    dims = marked_dims(tensor)
    if not dims:
        return None
    shape_ids = getattr(tensor, "_dynamo_shape_ids", None) or {}
    bounds = getattr(tensor, "_dynamo_unbacked_bounds", None) or {}
    return {
        dim: UnbackedDim(
            symbol=str(fake.shape[dim]), shape_id=shape_ids.get(dim), min=bounds.get(dim, (None, None))[0],
            max=bounds.get(dim, (None, None))[1],
        )
        for dim in sorted(dims)
    }
