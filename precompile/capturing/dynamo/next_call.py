"""Whether a captured call would be served again: a call that changes state its own guards check
(an eval-mode forward that fills a dict cache on its first call, a counter it reads) leaves an
artifact that serves that call once and refuses the same call after it.

When the artifact is built, `served_again` checks each captured call's arguments against the
guards of every variant Dynamo then holds for fn's entry frame, in the state the calls left and
under the mode the call itself ran under (`CallMode`: a `with torch.autocast(...)` or
`torch.inference_mode()` around one call is how it is served, not a change); when none passes, it
warns, naming the first check that fails, and says how to record the next variant too (call it
again inside the capture). Frames the entry reaches through graph breaks are not checked here.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from dataclasses import dataclass

import torch

from precompile.capturing.dynamo.tensor_keys import autocast_devices
from precompile.errors import PrecompileWarning

log = logging.getLogger("precompile")


@dataclass(frozen=True)
class CallMode:
    """What a capture call ran under that its guards check and a `with` block around the call sets:
    grad mode, the dispatch key sets (inference_mode, autocast on or off), autocast's dtypes and
    cache, the default dtype."""

    grad: bool
    include: torch._C.DispatchKeySet
    exclude: torch._C.DispatchKeySet
    autocast_dtypes: tuple[tuple[str, torch.dtype], ...]
    autocast_cache: bool
    default_dtype: torch.dtype

    @classmethod
    def now(cls) -> CallMode:
        dtypes = tuple((device, torch.get_autocast_dtype(device)) for device in autocast_devices())
        return cls(grad=torch.is_grad_enabled(), include=torch._C._dispatch_tls_local_include_set(),
                   exclude=torch._C._dispatch_tls_local_exclude_set(), autocast_dtypes=dtypes,
                   autocast_cache=torch.is_autocast_cache_enabled(), default_dtype=torch.get_default_dtype())

    def _set(self) -> None:
        for device, dtype in self.autocast_dtypes:
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(self.autocast_cache)
        torch.set_default_dtype(self.default_dtype)

    @contextlib.contextmanager
    def entered(self):
        """This mode, for the block; the caller's back after it."""
        before = CallMode.now()
        with torch._C._ForceDispatchKeyGuard(self.include, self.exclude), torch.set_grad_enabled(self.grad):
            self._set()
            try:
                yield
            finally:
                before._set()


def _entry_locals(fn, args: tuple, kwargs: dict) -> dict | None:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def served_again(fn, args: tuple, kwargs: dict, call: int) -> bool:
    """Whether some variant of fn's entry frame passes call `call`'s arguments now; warns if not."""
    from precompile.torch_compat import debug_get_cache_entry_list

    code = getattr(fn, "__code__", None)
    f_locals = _entry_locals(fn, args, kwargs)
    if code is None or f_locals is None:
        return True
    managers = [entry.guard_manager for entry in debug_get_cache_entry_list(code)]
    if not managers or any(manager.check(f_locals) for manager in managers):
        return True
    failed = [part.strip() for part in managers[-1].check_verbose(f_locals).verbose_code_parts if part.strip()]
    message = (
        f"call {call} of the capture changed state that its own guards check ({'; '.join(failed[:2]) or 'a guard'} "
        "no longer holds): the artifact serves that call once and refuses the same call after it. Call it again "
        "inside the capture to record the next variant too, or keep that state out of what fn reads"
    )
    log.warning("%s", message)
    warnings.warn(message, PrecompileWarning, stacklevel=5)
    return False
