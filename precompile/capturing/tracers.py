"""The capture front-ends, passed as `tracer=` to `precompile.capture`. Plain configuration."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MakeFxTracer:
    """One non-strict make_fx trace of exactly one positional call.

    Control flow, shapes, dtypes and devices are specialized to that call. `decompositions` (a
    dict from OpOverload to a decomposition function) is forwarded to make_fx.
    """

    decompositions: Mapping[Any, Callable[..., Any]] | None = None

    tag = "make_fx"


@dataclass(frozen=True)
class DynamoTracer:
    """Execution-driven multi-graph capture through Dynamo (the spec's default tracer).

    Each call is recorded with the variants Dynamo compiles for it; calls of two batch sizes or
    lengths give Dynamo's automatic-dynamic variant, which serves other sizes too. `dynamic=True`
    makes every dim dynamic from the first call (`torch.compile(dynamic=True)`); under the default,
    dims marked with `torch._dynamo.mark_dynamic` before a call are dynamic from it.
    `guard_filter_fn` keeps or drops guards, `recompile_limit` caps each frame's variants, and the
    `require_*` gates refuse, at write time, coverage gaps (among them state the model built on
    a call before the capture) and risky drops (docs/usage.md).
    """

    guard_filter_fn: Callable[[Sequence[Any]], Sequence[bool]] | None = None
    recompile_limit: int = 256
    dynamic: bool | None = None
    require_complete: bool = True
    require_no_risky_drops: bool = True

    tag = "dynamo"
