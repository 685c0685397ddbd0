"""Parametrized modules (torch.nn.utils.parametrize: weight_norm, spectral_norm, orthogonal) and
DynamoTracer: Dynamo's guard serialization pickles the modules its guards reach, and a parametrized
module refuses to be pickled (torch raises "Serialization of parametrized modules is only supported
through state_dict()"), so no torch this project supports can save such a capture. Refused before
anything compiles, naming the modules and the two ways out."""
from __future__ import annotations

import torch

from precompile.errors import CaptureRefused


def refuse_parametrized_modules(args: tuple, kwargs: dict) -> None:
    from torch.nn.utils import parametrize

    found = []
    for position, value in [*enumerate(args), *kwargs.items()]:
        if isinstance(value, torch.nn.Module):
            found += [f"{position}:{name or '(itself)'}" for name, module in value.named_modules()
                      if parametrize.is_parametrized(module)]
    if found:
        shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5 else "")
        raise CaptureRefused(
            f"the module arguments hold parametrized modules (argument:module {shown}: weight_norm, spectral_norm, "
            f"orthogonal, ...), which torch {torch.__version__}'s Dynamo cannot save guards for (a parametrized "
            "module refuses to be pickled). Capture with tracer=precompile.MakeFxTracer(), or, to serve "
            "inference, bake the parametrization in first: torch.nn.utils.parametrize.remove_parametrizations("
            "module, 'weight', leave_parametrized=True)"
        )
