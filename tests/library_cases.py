"""Shapes the model libraries' code has, small (importable by a fresh process: DynamoTracer needs that).

- A global dict subclass whose own __setitem__ files an entry under another key, the shape of
  transformers' _CanRecordRegistry: unpickling such a dict replays __setitem__, so a pickled copy of
  it holds other keys than the live one.
- diffusers' attention block tail: a transposed view added to a residual, then group norm.
"""
from __future__ import annotations


class FiledByType(dict):
    """Registering an object files it under its type's name; the live entries here were put in with
    dict's own __setitem__, under the names a caller chose."""

    def __setitem__(self, obj, value):
        super().__setitem__(str(type(obj)), value)


REGISTRY = FiledByType()
dict.__setitem__(REGISTRY, "scale", 3.0)


def scaled_by_the_first_entry(x):
    key = next(iter(REGISTRY))
    return x * REGISTRY[key]


def group_norm_after_a_transposed_add(norm, tokens, residual):
    """An attention block's tail (diffusers' AttnBlock): tokens (batch, h*w, channels) back to an image,
    added to the residual, then group norm. The sum's strides follow the transposed view, which the
    trace does not predict, and the CPU group norm kernel takes only a contiguous input."""
    batch, _, channels = tokens.shape
    image = tokens.transpose(-1, -2).reshape(batch, channels, *residual.shape[-2:])
    return norm((image + residual) / 1.0)
