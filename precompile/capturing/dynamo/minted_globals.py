"""Globals Dynamo installs by an object's id into the module of the code it compiles
(`OutputGraph.install_global_by_id`: `___module_collections_<id>_c<compile id>`, and `_<id>_c<n>` for
the torch module when the code asks `type(x) is torch.Tensor`). No other process binds those names:
each one the artifact needs is recorded by what it holds, a module by its name, among the frame's
import sources, which the driver binds in the serving process as it binds Dynamo's own import aliases.
"""
from __future__ import annotations

import re
import sys
import types

from precompile.artifact.metadata import DynamoFrame, VariantGuards
from precompile.errors import CaptureRefused

# A name Dynamo's transformed bytecode reads: ___module_<name>_<id>_c<compile id> and the like.
_MINTED_BY_ID = re.compile(r"^___\w+_\d+_c\d+$")
# A global a guard reads: G['_<id>_c<n>'] (empty prefix) or G['___module_<name>_<id>_c<n>'].
_GUARDED_BY_ID = re.compile(r"G\['(\w*_\d+_c\d+)'\]")


def _names_used(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _as_module(code, name: str, value, reader: str) -> None:
    """Record `name` (bound to `value`) among `code`'s import sources, or refuse: only a module can be
    bound again by name."""
    if not isinstance(value, types.ModuleType):
        raise CaptureRefused(
            f"{reader} for {code.python_code.co_name} ({code.python_module}) reads {name}, a "
            f"{type(value).__name__} Dynamo bound by id, which no other process can have; capture with "
            "MakeFxTracer, or keep that object out of the compiled code"
        )
    code.import_sources[name] = value.__name__


def record_minted_modules(code) -> None:
    """Dynamo binds some modules its transformed bytecode reads under minted names in the compiled
    code's module and records none of them in the package: add each to the code's import sources, so
    the driver seeds it as it seeds Dynamo's own import aliases. A minted global that is not a module
    cannot be seeded in another process: refuse the capture, naming it."""
    from precompile.torch_compat import SerializedCode

    scope = sys.modules[code.python_module].__dict__
    for guarded in code.guarded_codes:
        for name in sorted(_names_used(SerializedCode.to_code_object(guarded.dynamo_code))):
            if not _MINTED_BY_ID.match(name) or name in code.import_sources or name not in scope:
                continue
            _as_module(code, name, scope[name], "Dynamo's compiled code")


def record_guarded_minted_modules(entry, frames: list[DynamoFrame], guards: list[VariantGuards]) -> None:
    """An installed artifact's guards are Dynamo's own, rebuilt at load, and read the frame module's
    globals when a call comes: each global named by id that a variant's guards read (longformer's
    `CLASS_MATCH G['_<id>_c6'].Tensor`, the torch module) is recorded by its module's name, so the
    driver binds that name again before building them. A standalone artifact renders such a source
    by name instead (guard_code)."""
    from precompile.codegen.drivers.dynamo_checks import rebuilt_guards_state

    listed = {(v.frame, v.variant): v for v in guards}
    for code, frame in zip(entry.codes, frames):
        if frame.runs_as_python:
            continue
        live = sys.modules[code.python_module].__dict__
        for variant, guarded in enumerate(code.guarded_codes):
            meta = listed.get((frame.qualname, variant))
            if meta is None:
                continue
            names = {name for line in (*meta.checks, *meta.by_name) for name in _GUARDED_BY_ID.findall(line)}
            names -= set(code.import_sources)
            if not names:
                continue
            # torch 2.13 keeps what it installed in the saved scope; 2.12 and 2.14 leave it in the module.
            saved = rebuilt_guards_state(guarded.guards_state, meta.by_name, frozenset(meta.policy_dropped), live)
            scope = saved.output_graph.global_scope
            for name in sorted(names):
                value = scope[name] if isinstance(scope.get(name), types.ModuleType) else live.get(name, scope.get(name))
                _as_module(code, name, value, f"the guards of variant {variant}")
