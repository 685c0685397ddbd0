"""Shapes the model libraries' code has, small (importable by a fresh process: DynamoTracer needs that).

- A global dict subclass whose own __setitem__ files an entry under another key, the shape of
  transformers' _CanRecordRegistry: unpickling such a dict replays __setitem__, so a pickled copy of
  it holds other keys than the live one.
- diffusers' attention block tail: a transposed view added to a residual, then group norm.
- diffusers' ModelMixin: a config FrozenDict that lists the arguments left at their defaults in the
  order of a set (the string hash seed's), read on every submodule lookup by its __getattr__.
"""
from __future__ import annotations

import collections

import torch


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


class FrozenDict(collections.OrderedDict):
    """diffusers.configuration_utils.FrozenDict: each item also an attribute."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for key, value in self.items():
            setattr(self, key, value)


FrozenDict.__module__ = "diffusers.configuration_utils"  # what the spelling goes by


class ConfiguredModel(torch.nn.Module):
    """diffusers' ModelMixin around one linear layer: `register_to_config` keeps the names left at their
    defaults as `list(set(...) - set(...))`, and `__getattr__` reads the config for every submodule."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 4)
        defaults = list({"alpha", "beta", "gamma", "delta", "epsilon"} - {"beta"})
        self._internal_dict = FrozenDict(scale=2.0, _use_default_values=defaults)

    def __getattr__(self, name):
        is_in_config = "_internal_dict" in self.__dict__ and hasattr(self.__dict__["_internal_dict"], name)
        if is_in_config and name not in self.__dict__:
            return self._internal_dict[name]
        return super().__getattr__(name)

    @property
    def config(self):
        return self._internal_dict

    def forward(self, x):
        return self.lin(x) * self.config.scale


def configured_step(model, x):
    return model(x)
