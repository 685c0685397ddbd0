"""Whether a captured call would be served again: a call that changes state its own guards check
(an eval-mode forward that fills a dict cache on its first call, a counter it reads) leaves an
artifact that serves that call once and refuses the same call after it.

When the artifact is built, `served_again` checks each captured call's arguments against the
guards of every variant Dynamo then holds for fn's entry frame, in the state the calls left; when
none passes, it warns, naming the first check that fails, and says how to record the next variant
too (call it again inside the capture). Frames the entry reaches through graph breaks are not
checked here.
"""
from __future__ import annotations

import inspect
import logging
import warnings

from precompile.errors import PrecompileWarning

log = logging.getLogger("precompile")


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
