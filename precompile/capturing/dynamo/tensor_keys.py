"""A TENSOR_MATCH's dispatch keys as python_code checks them again: torch compares each tensor's keys
as the thread-local include/exclude sets adjust them (inference_mode drops autograd's, autocast keeps
its own), and Dynamo builds the check under the sets of the call it compiled. The guard filter notes
those sets and the modes that set them (`dispatch_state`); a variant's tensor check is rendered with
the modes and the rows whose tensor was an inference tensor (`tensor_kind`), and the driver builds it
under the same sets (codegen/drivers/dispatch_state.py), whatever mode the loading process is in.
Whether this torch's dimension-marking guard is enforced decides whether its markings are rendered
(`marking_guard_enforced`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from precompile.capturing.dynamo.guard_expressions import Unrenderable
from precompile.codegen.drivers.dispatch_state import dispatch_key_sets
from precompile.codegen.drivers.dynamo_guards import tensor_example

_AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla", "ipu", "mtia", "maia")


@functools.cache
def autocast_devices() -> tuple[str, ...]:
    """The device types whose autocast state this torch build keeps."""
    known = []
    for device in _AUTOCAST_DEVICES:
        try:
            torch.is_autocast_enabled(device)
        except RuntimeError:  # a device type this build does not know
            continue
        known.append(device)
    return tuple(known)


@dataclass(frozen=True)
class DispatchState:
    """torch's thread-local dispatch key sets as Dynamo built a compile's tensor guards: each tensor's
    keys are compared as these sets adjust them (inference mode drops autograd's, autocast adds its
    own), so the artifact builds its check under the same sets."""

    modes: tuple[str, ...]
    """What the call ran under that sets them: "inference_mode", "autocast:<device type>"."""
    rebuilt: bool
    """Whether those modes, switched on in a fresh thread, give exactly these sets (the driver's
    `dispatch_key_sets`); where not, something else set them and the artifact cannot rebuild them."""
    text: str
    """The sets as torch prints them, for a refusal's message."""


def dispatch_state() -> DispatchState:
    """The calling thread's dispatch key sets, and the modes that set them."""
    modes = (("inference_mode",) if torch.is_inference_mode_enabled() else ()) + tuple(
        f"autocast:{device}" for device in autocast_devices() if torch.is_autocast_enabled(device))
    include, exclude = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()
    rebuilt = tuple(keys.raw_repr() for keys in dispatch_key_sets(modes)) == (include.raw_repr(), exclude.raw_repr())
    return DispatchState(modes=modes, rebuilt=rebuilt, text=f"include {include}, exclude {exclude}")


def dispatch_modes(seen: dict) -> tuple[str, ...]:
    """The modes a variant's tensor guards were built under, from what its guard filter saw (`seen`:
    {seen_key: Seen}); none where it kept no tensor guard or its dispatch state is not rebuilt from them."""
    for facts in seen.values():
        if facts.dispatch is not None:
            return facts.dispatch.modes if facts.dispatch.rebuilt else ()
    return ()


def tensor_kind(label: str, value, pytype: type, dispatch: DispatchState | None,
                variant_modes: tuple[str, ...] | None) -> tuple[bool, tuple[str, ...]]:
    """Whether a TENSOR_MATCH's tensor (`value`, from the saved guard state) was an inference tensor,
    and the modes its keys were read under; Unrenderable where python_code cannot build its check
    again: its compile's dispatch sets are not rebuilt from their modes, another tensor of the variant
    was read under other modes (`variant_modes`), or its keys are neither a plain nor an inference
    tensor's."""
    if dispatch is None or not dispatch.rebuilt:
        raise Unrenderable(f"{label}: its check compares dispatch keys as the capture's thread adjusted them "
                           f"({dispatch.text if dispatch else 'not seen by the guard filter'}), which python_code "
                           "rebuilds only for inference_mode and autocast")
    recorded = getattr(value, "dispatch_keys", None)
    plain = _plain_keys(pytype, str(value.dtype), str(value.device))
    if recorded is None or recorded.raw_repr() not in plain:
        raise Unrenderable(f"{label}: its dispatch keys ({recorded}) are not those of a plain or inference "
                           f"{value.device} tensor")
    if variant_modes is not None and variant_modes != dispatch.modes:
        raise Unrenderable(f"{label}: read under {dispatch.modes}, another tensor of this variant under {variant_modes}")
    return recorded.raw_repr() == plain[1] != plain[0], dispatch.modes


@functools.cache
def _plain_keys(pytype: type, dtype: str, device: str) -> tuple[int, int]:
    """The raw dispatch keys of a plain and of an inference tensor of this kind (one pair per kind,
    however many parameters share it)."""
    from precompile.torch_compat import dispatch_keys

    plain, inference = (dispatch_keys(tensor_example(pytype, dtype, device, False, kind)).raw_repr() for kind in (False, True))
    return plain, inference


@functools.cache
def marking_guard_enforced() -> bool:
    """Whether this torch's C++ dimension-marking guard refuses a tensor marked dynamic where the
    capture saw none (torch 2.13's lets it pass): rendered guards decide as torch's manager does."""
    from precompile.torch_compat import RootGuardManager

    root = RootGuardManager()
    try:
        root.add_dimension_marking_guard({}, ["_dynamo_dynamic_indices"], {}, ["probe"], None)
    except (AttributeError, TypeError):  # another torch's guard manager: render the checks as written
        return True
    marked = torch.ones(2)
    marked._dynamo_dynamic_indices = {0}  # type: ignore[attr-defined]
    return not root.check(marked)
