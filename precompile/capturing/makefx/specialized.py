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
from precompile.capturing.makefx.reads import ReadLog, attribute_spelling
from precompile.capturing.makefx.registries import REGISTRY
from precompile.codegen.drivers.makefx_reads import GLOBAL_STATE, MODULE_HOOKS, module_hooks, spelled
from precompile.errors import CaptureRefused, PrecompileWarning

log = logging.getLogger("precompile")


CONDITIONAL_STATE = ("grad_mode", "inference_mode")
"""Global state recorded only where the call can depend on it: grad mode where fn computes gradients
(a training step), either where code the trace ran asks for it (`torch.is_grad_enabled()`), so that a
forward captured with grad on serves under no_grad or inference_mode, and one captured under no_grad
serves under inference_mode, when nothing asks."""


def global_state_now(modules, slots) -> dict[str, str]:
    """torch's global state and the module arguments' hooks, spelled, as the trace is about to run."""
    return {**{name: str(spelled(get())) for name, get in GLOBAL_STATE.items()}, MODULE_HOOKS: module_hooks(modules, slots)}


def global_state(before: dict[str, str], grad_matters: bool, read: set[str]) -> list[SpecializedValue]:
    """The records of the global state the trace ran under (`before`, from global_state_now): all of
    it but CONDITIONAL_STATE, which only where the call can depend on it (`read`: what code the
    trace ran asked for); and the hooks the module arguments ran, which the served graph holds."""
    wanted = read | ({"grad_mode"} if grad_matters else set())
    return [SpecializedValue(kind="global_state", name=name, value=value) for name, value in before.items()
            if name not in CONDITIONAL_STATE or name in wanted]


def _importable(module: str) -> bool:
    loaded = sys.modules.get(module)
    # torch.backends.cudnn and its siblings replace their module by an instance of a subclass, whose
    # __spec__ is None: importing torch brings them back under their names.
    return module != "__main__" and loaded is not None and (getattr(loaded, "__spec__", None) is not None
                                                            or module.startswith("torch.backends."))


def records(read: ReadLog, fn_module: str) -> list[SpecializedValue]:
    """The noted reads as SPECIALIZED records, sorted by where they live; a closure cell checked as part
    of the function holding it (read as an attribute or a global) is that function's record alone. What
    a served call cannot check is warned about where it is fn's own (in fn's module: a library's decorator closures are
    its settings, listed by `precompile guards` but not warned about)."""
    out: list[SpecializedValue] = []
    objects = {owner: obj for owner, obj in read.owners.values()}
    for (owner, name), value in sorted(read.attributes.items(), key=_by_owner):
        keyword = owner.arg if isinstance(owner.arg, str) else ""
        record = SpecializedValue(kind="attribute", name=name, value=value, module=owner.module,
                                  arg=owner.arg if isinstance(owner.arg, int) else None, keyword=keyword, chain=owner.chain)
        _refuse_changed(record, attribute_spelling(objects[owner], name))
        out.append(record)
    for (module, name), value in sorted(read.globals.items()):
        where = read.globals_of[module]
        # a module class's method (`LayerNorm.forward`) is read on the class; a settings object's field on it
        head, _, attribute = name.rpartition(".")
        holder = _walked(where, head) if head else None
        if head and not isinstance(holder, (type, property)):  # a class's attribute, a property's getter: by getattr
            now = attribute_spelling(holder, attribute)
        else:
            now = spelled(getattr(holder, attribute, None) if head else
                          where.get(name) if isinstance(where, dict) else getattr(where, name, None))
        if value == REGISTRY and module == fn_module:  # fn's own registry is a setting of fn's: checked
            if now is None:
                continue
            value = now
        elif value == REGISTRY:  # a library's: what it holds differs from process to process; listed, not checked
            out.append(SpecializedValue(kind="global", name=name, value=value, module=module, checked=False))
            continue
        record = SpecializedValue(kind="global", name=name, value=value, module=module, checked=_importable(module))
        _refuse_changed(record, now)
        out.append(record)
    for (function, name), value in sorted(read.closures.items()):
        out.append(SpecializedValue(kind="closure", name=name, value=value, module=function, checked=False))
    out = [r for r in out if not _spelled_with(r, out)]
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


def _walked(where, dotted: str):
    """What `dotted` (`CFG.sub`) names in a module's globals dict or in a module, by getattr past the first name."""
    first, *rest = dotted.split(".")
    value = where.get(first) if isinstance(where, dict) else getattr(where, first, None)
    for name in rest:
        value = getattr(value, name, None)
    return value


def _by_owner(item) -> tuple:
    """Attributes sorted by where they live: positional module arguments first, then those by keyword."""
    (owner, name), _ = item
    slot = (0, owner.arg, "") if isinstance(owner.arg, int) else (1, 0, owner.arg)
    return slot, owner.module, owner.chain, name


def _spelled_with(cell: SpecializedValue, out: list[SpecializedValue]) -> bool:
    """Whether a closure cell's value is checked as part of a checked value's spelling: the function
    holding it was read as a model attribute or a global (`self.act = make_act(0.5)`), which spells
    it with what its cells hold."""
    if cell.kind != "closure":
        return False
    holder = f"function {cell.module} ("  # then its code's text (or line): `(code 1a2b...)`
    return any(r.checked and holder in r.value and f"{cell.name}=" in r.value.partition(holder)[2] for r in out)


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
