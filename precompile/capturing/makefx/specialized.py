"""What a MakeFx artifact checks besides its calling convention: the Python values its trace read.

`global_state()` spells torch's global state before the trace; `records()` turns what
`reads.recording()` noted into the SPECIALIZED literal, refusing a capture whose own call changed
a value it read (the artifact would refuse every call after it), and warning about values a served
call cannot reach (closure cells, globals of __main__), which it then does not check.
"""
from __future__ import annotations

import logging
import sys
import warnings

from precompile.artifact.metadata import SpecializedValue, specialized_source
from precompile.capturing.makefx.reads import ReadLog, plain_attribute
from precompile.codegen.drivers.makefx import GLOBAL_STATE, MODULE_HOOKS, module_hooks, spelled
from precompile.errors import CaptureRefused, PrecompileWarning

log = logging.getLogger("precompile")


def global_state(grad_matters: bool, modules, positions) -> list[SpecializedValue]:
    """torch's global state as the trace runs under it; grad mode only where it can change what the
    call computes (a parameter or input requires grad: a backward, what fn's code does under it); and
    the hooks the module arguments would run, which the trace runs and the served graph holds."""
    return [SpecializedValue(kind="global_state", name=name, value=str(spelled(get())))
            for name, get in GLOBAL_STATE.items() if grad_matters or name != "grad_mode"] + [
        SpecializedValue(kind="global_state", name=MODULE_HOOKS, value=module_hooks(modules, positions))]


def _importable(module: str) -> bool:
    loaded = sys.modules.get(module)
    return module != "__main__" and loaded is not None and getattr(loaded, "__spec__", None) is not None


def records(read: ReadLog, fn_module: str) -> list[SpecializedValue]:
    """The noted reads as SPECIALIZED records, sorted by where they live. What a served call cannot
    check is warned about where it is fn's own (in fn's module: a library's decorator closures are
    its settings, listed by `precompile guards` but not warned about)."""
    out: list[SpecializedValue] = []
    objects = {owner: obj for owner, obj in read.owners.values()}
    for (owner, name), value in sorted(read.attributes.items(), key=lambda item: (item[0][0], item[0][1])):
        record = SpecializedValue(kind="attribute", name=name, value=value, module=owner.module,
                                  arg=owner.arg, chain=owner.chain)
        _refuse_changed(record, spelled(plain_attribute(objects[owner], name)))
        out.append(record)
    for (module, name), value in sorted(read.globals.items()):
        record = SpecializedValue(kind="global", name=name, value=value, module=module,
                                  checked=_importable(module))
        _refuse_changed(record, spelled(read.globals_of[module].get(name)))
        out.append(record)
    for (function, name), value in sorted(read.closures.items()):
        out.append(SpecializedValue(kind="closure", name=name, value=value, module=function, checked=False))
    unchecked = [r for r in out if not r.checked and (r.module == fn_module or r.module.startswith(fn_module + "."))]
    if unchecked:
        listed = ", ".join(f"{specialized_source(r)} = {r.value}" for r in unchecked[:8])
        more = f" and {len(unchecked) - 8} more" if len(unchecked) > 8 else ""
        message = (
            f"the MakeFx trace read {listed}{more}, which a served call cannot check (a closure cell, a global of "
            "__main__ or of a module that does not import by name): the artifact keeps the captured values. Pass "
            "them as arguments or module attributes, or define them in an importable module, to have them checked"
        )
        log.warning("%s", message)
        warnings.warn(message, PrecompileWarning, stacklevel=4)
    return out


def _refuse_changed(record: SpecializedValue, now: str | None) -> None:
    if now != record.value:
        where = specialized_source(record)
        raise CaptureRefused(
            f"fn changed {where} during the captured call ({record.value} -> {now if now is not None else 'a value of another kind'}), "
            "after its trace read it: the artifact, specialized on the value it read, would refuse every call after "
            "this one. Keep such state outside fn (pass it in, or update it after the call; a flag fn sets on its "
            "first call, such as a warn-once flag, can be set before capturing), or capture with DynamoTracer, "
            "which replays the update"
        )
