"""What a standalone Dynamo artifact carries instead of the pickled package entry.

- Code objects travel marshalled (Python-version locked): each frame's original code and each
  variant's transformed code, with every global name Dynamo minted from its process-wide counter or
  a fresh uuid renamed, through nested code objects, to a name drawn from what the capture holds,
  never from process state, so two captures of the same thing are the same bytes. A name bound to
  something of this artifact's own (a compiled graph, a continuation, the stand-in for
  torch._dynamo.utils) is `__precompile_<12 hex>_<stem>`, the hex a digest of the artifact's code:
  two artifacts (a live torch.compile, another release of the same fn) never bind the same name to
  different things. A name bound to what every artifact binds it to (an import alias to its module,
  the builtins-dict key to the module's builtins) is `__precompile_<stem>`: a change to the
  captured code does not rename it, so the guard lines that read it stay as they were.
- The per-frame tables the driver seeds and dispatches from, as literals.
- Each variant's kept guards rendered as the Python that checks them (`guard_code`); a kept guard
  with no faithful rendering refuses the capture, naming it (no guard state travels pickled).
"""
from __future__ import annotations

import ast
import base64
import dis
import hashlib
import marshal
import pickle
import re
import sys
import types
from dataclasses import dataclass, field

import msgspec

from precompile.artifact.metadata import DynamoFrame, VariantGuards
from precompile.capturing.dynamo.guard_code import Unrenderable
from precompile.capturing.dynamo.key_lookups import KeyLookups
from precompile.capturing.dynamo.named_identity import renderable
from precompile.capturing.dynamo.tensor_keys import dispatch_modes
from precompile.capturing.dynamo.variant_rendering import RenderedVariant, render_variant
from precompile.errors import CaptureRefused

_MINTED_PREFIX = "__precompile_"


@dataclass
class CodeBlob:
    key: str
    """"F" for frame F's original code, "F.V" for variant V's transformed code."""
    what: str
    data: bytes
    """The code marshalled as `line_free` leaves it."""
    first_line: int
    """Where the code starts in its file: the driver moves the marshalled code there at load."""

    @property
    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")


@dataclass
class StandaloneParts:
    frames: list[dict]
    defaults: dict | None
    blobs: list[CodeBlob]
    rendered: list[RenderedVariant]
    remainder: dict = field(default_factory=dict)
    references: tuple[str, ...] = ()
    minted: dict[str, str] = field(default_factory=dict)
    """Each name Dynamo drew from its process-wide counters or a uuid (a compiled graph, a
    continuation, the builtins-dict key) -> the name the artifact's code reads it by."""


def rename_code(code: types.CodeType, renames: dict[str, str], filename: str) -> types.CodeType:
    """`code` with the global names in `renames` renamed, its own name too where Dynamo minted it (a
    continuation's), and its file named `filename` (the driver names the module's file again at
    load: no capture-side path travels), in it and every code object nested in it."""
    consts = tuple(rename_code(c, renames, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    renamed = code.replace(co_names=tuple(renames.get(name, name) for name in code.co_names), co_consts=consts,
                           co_filename=filename, co_name=renames.get(code.co_name, code.co_name))
    qualname = getattr(code, "co_qualname", None)  # Python 3.11+
    return renamed.replace(co_qualname=renames[qualname]) if qualname in renames else renamed  # type: ignore[call-arg]


_RESUME_LINE = re.compile(r"(?<=_at_)\d+")


def line_free(code: types.CodeType) -> tuple[types.CodeType, int]:
    """`code` as if its first line were line 1 (its nested code moved with it, and the lines Dynamo
    names a continuation after: `torch_dynamo_resume_in_step_at_6`), and the line it starts on. A
    line table counts from the code's first line, so code moved down its file (a comment added above
    it) marshals to the same bytes: two releases that only moved code carry the same bytecode. The
    driver moves it back (`_code_object`)."""
    shift = code.co_firstlineno - 1

    def named(name: str) -> str:
        if not name.startswith("torch_dynamo_resume_in_"):
            return name
        return _RESUME_LINE.sub(lambda line: str(int(line.group(0)) - shift), name)

    def moved(c: types.CodeType) -> types.CodeType:
        consts = tuple(moved(const) if isinstance(const, types.CodeType) else const for const in c.co_consts)
        renamed = c.replace(co_firstlineno=c.co_firstlineno - shift, co_consts=consts, co_name=named(c.co_name))
        qualname = getattr(c, "co_qualname", None)  # Python 3.11+
        return renamed.replace(co_qualname=named(qualname)) if qualname else renamed  # type: ignore[call-arg]

    return moved(code), code.co_firstlineno


def minted_renamed(text: str, parts: StandaloneParts) -> str:
    """python_code's `text` with every name Dynamo minted in this process, wherever the metadata,
    the guard listings and their rendered checks spell it (a guard's source, a continuation's
    frame), spelled as the artifact's code reads it: the same in every capture of the same thing."""
    if not parts.minted:
        return text
    names = sorted(parts.minted, key=len, reverse=True)
    pattern = re.compile(r"(?<![\w])(" + "|".join(re.escape(name) for name in names) + r")(?![\w])")
    return pattern.sub(lambda match: parts.minted[match.group(1)], text)


def _minted_names(entry, states: dict) -> tuple[dict[str, str], set[str]]:
    """Each name Dynamo minted for the package's frames -> its stable stem in this artifact: graph_K
    (K: the compiled graph's position), resume_F_N (F: the continuation's frame), builtins_F_V, and
    import aliases as they are (they name a module); and the names among them that every artifact
    binds to the same object (an import alias of a module the driver imports, a builtins-dict key)."""
    stems: dict[str, str] = {}
    shared: set[str] = set()
    graphs = 0
    for index, code in enumerate(entry.codes):
        for backend_id in code.backend_ids:
            stems.setdefault(backend_id, f"graph_{graphs}")
            graphs += 1
        if code.install_to_global:
            for number, name in enumerate(code.function_names):
                stems.setdefault(name, f"resume_{index}_{number}")
        for alias, module in code.import_sources.items():
            stems.setdefault(alias, alias.lstrip("_"))
            if module != "torch._dynamo.utils":  # that one may be bound to this artifact's stand-in
                shared.add(alias)
        for (frame, variant), state in states.items():
            key = state.output_graph.name_of_builtins_dict_key_in_fglobals
            if frame == index and key:
                stems.setdefault(key, f"builtins_{frame}_{variant}")
                shared.add(key)
    return stems, shared


# What Dynamo's transformed bytecode reads from torch._dynamo.utils around its compiled graphs: a
# profiler range, and a tensor's size or stride read as a plain call. The driver's stand-in
# (_DynamoUtils) does the same without importing Dynamo; a test keeps the two in step.
DYNAMO_UTILS_STAND_IN = frozenset({"record_pregraph_bytecode_enter", "record_pregraph_bytecode_exit", "call_size",
                                   "call_stride", "call_storage_offset"})


def _read_in_module(entry, transformed: dict, module: str) -> dict[str, set]:
    """`_attributes_read` over the transformed code of every frame in `module`: its frames bind one
    alias, a stand-in only where none of them reads more of it than the stand-in has."""
    return _attributes_read([code for (index, _), code in transformed.items() if entry.codes[index].python_module == module])


def _attributes_read(codes: list[types.CodeType]) -> dict[str, set]:
    """{global name: attributes the code reads from it right after loading it}, through nested code. A
    global stored in a local (torch 2.15's Dynamo keeps torch._dynamo.utils in one around its graph)
    is read wherever that local is: an attribute read of the local counts as one of the global."""
    found: dict[str, set] = {}
    for code in codes:
        instructions = list(dis.get_instructions(code))
        held = {second.argval: first.argval for first, second in zip(instructions, instructions[1:])
                if first.opname == "LOAD_GLOBAL" and second.opname == "STORE_FAST"}
        for first, second in zip(instructions, instructions[1:]):
            if first.opname == "LOAD_GLOBAL" and second.opname == "STORE_FAST":
                continue  # read where the local is loaded
            name = first.argval if first.opname == "LOAD_GLOBAL" else held.get(first.argval) if first.opname == "LOAD_FAST" else None
            if name is not None:
                attribute = second.argval if second.opname in ("LOAD_ATTR", "LOAD_METHOD") else "<used otherwise>"
                found.setdefault(name, set()).add(attribute)
        nested = _attributes_read([c for c in code.co_consts if isinstance(c, types.CodeType)])
        for name, attributes in nested.items():
            found.setdefault(name, set()).update(attributes)
    return found


def _literal_or_none(value):
    try:
        return value if ast.literal_eval(repr(value)) == value else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _defaults(fn) -> dict | None:
    """fn's defaults as literals, or None when one is not a literal (they go to the opaque remainder)."""
    found = {"defaults": fn.__defaults__, "kwdefaults": fn.__kwdefaults__}
    return found if all(v is None or _literal_or_none(v) is not None for v in found.values()) else None


def unrenderable_refusal(title: str, exc: Exception) -> CaptureRefused:
    """The refusal of a variant holding a kept guard python_code cannot check faithfully: it names the
    guard and why, and what serves the capture instead. (Artifacts once fell back to torch's guard
    manager rebuilt from pickled guard state at load, which depended on load order and on what
    unpickling does; a standalone artifact now checks every guard it keeps as written code.)"""
    reason = str(exc) if isinstance(exc, Unrenderable) else (
        f"rendering its guards failed on this torch ({type(exc).__name__}: {exc})")
    return CaptureRefused(
        f"{title} keeps a guard python_code cannot check as written code: {reason}. Drop that guard with "
        "DynamoTracer(guard_filter_fn=...) (the artifact then does not check it: the summary lists it as "
        "dropped), run the capture without what the guard pins (a torch function mode, a default device, "
        "saved-tensors hooks), or capture with MakeFxTracer, which keeps no guards"
    )


def readable_guards(entry, frames: list[DynamoFrame], guards: list[VariantGuards], seen: dict | None = None) -> list[VariantGuards]:
    """An installed artifact's variants, each with its kept checks rendered as a standalone artifact
    renders them (`VariantGuards.rendered`: text for readers, never run; load checks the guards torch
    rebuilds from the pickled state), so that inspect reads their values and tensors alike in both
    serving modes; a guard with no rendering is noted as such in the text. Each variant also
    gets the modes its call ran under (`VariantGuards.dispatch_modes`), which load rebuilds its
    guards under."""
    from precompile.codegen.drivers.dynamo_checks import read_guards_state

    listed = {(v.frame, v.variant): v for v in guards}
    for index, (code, frame) in enumerate(zip(entry.codes, frames)):
        if frame.runs_as_python:
            continue
        for variant, guarded in enumerate(code.guarded_codes):
            meta = listed.get((frame.qualname, variant))
            if meta is None:
                continue
            seen_here = (seen or {}).get((frame.qualname, variant)) or {}
            meta = listed[(frame.qualname, variant)] = msgspec.structs.replace(meta, dispatch_modes=dispatch_modes(seen_here))
            try:
                text = render_variant(index, variant, f"Frame {index} ({frame.qualname}), variant {variant}",
                                      read_guards_state(guarded.guards_state), frozenset(meta.policy_dropped),
                                      tuple(filter(renderable, meta.by_name)), {}, (seen or {}).get((frame.qualname, variant)),
                                      getattr(sys.modules.get(code.python_module), "__dict__", None), readable=True).source
            except Exception:  # a reading only: what stops it leaves this variant's values unread, as before
                continue
            listed[(frame.qualname, variant)] = msgspec.structs.replace(meta, rendered=text)
    return [listed[(v.frame, v.variant)] for v in guards]


def standalone_parts(entry, frames: list[DynamoFrame], guards: list[VariantGuards], fn, backends_pickled: dict,
                     subgraph_sources: list[str], seen: dict | None = None,
                     lookups: KeyLookups | None = None) -> StandaloneParts:
    """`seen`: {(frame qualname, variant): what its kept guards' sources held as Dynamo built them}
    (GuardLedger.seen), which the rendered checks compare with; `lookups`: dicts checked by key."""
    from precompile.codegen.drivers.dynamo_checks import read_guards_state
    from precompile.torch_compat import SerializedCode

    states = {
        (index, variant): read_guards_state(guarded.guards_state)
        for index, code in enumerate(entry.codes) for variant, guarded in enumerate(code.guarded_codes)
        if not frames[index].runs_as_python
    }
    originals = [SerializedCode.to_code_object(code.python_code) for code in entry.codes]
    transformed = {(i, v): SerializedCode.to_code_object(g.dynamo_code)
                   for i, code in enumerate(entry.codes) for v, g in enumerate(code.guarded_codes) if (i, v) in states}
    stems, shared = _minted_names(entry, states)
    # The prefix names this artifact: a digest of its code with the stems in place (stable across
    # captures of the same code), so two artifacts' own names differ and one artifact's never change.
    digest = hashlib.sha256()
    stemmed = {name: "_" + stem for name, stem in stems.items()}
    for code in originals:  # a continuation's own name is one Dynamo minted
        digest.update(marshal.dumps(line_free(rename_code(code, stemmed, ""))[0]))
    for key in sorted(transformed):
        digest.update(marshal.dumps(line_free(rename_code(transformed[key], stemmed, ""))[0]))
    for text in subgraph_sources:
        digest.update(text.encode("utf-8"))
    prefix = f"{_MINTED_PREFIX}{digest.hexdigest()[:12]}_"
    renames = {name: (_MINTED_PREFIX if name in shared else prefix) + stem for name, stem in stems.items()}
    listed = {(v.frame, v.variant): v for v in guards}
    tables, blobs, rendered, references = [], [], [], set()
    remainder: dict = {"guards": {}, "backends": {renames[b]: aot for b, aot in backends_pickled.items()}}
    for index, (code, frame) in enumerate(zip(entry.codes, frames)):
        filename = f"<module {code.python_module}>"
        blobs.append(_blob(str(index), f"frame {index} ({frame.qualname}): original code",
                           rename_code(originals[index], renames, filename)))
        names = []
        for variant in range(len(code.guarded_codes)):
            if (index, variant) not in states:
                continue
            blobs.append(_blob(f"{index}.{variant}", f"frame {index} ({frame.qualname}), variant {variant}: transformed code",
                               rename_code(transformed[(index, variant)], renames, filename)))
            title = f"Frame {index} ({frame.qualname}), variant {variant}"
            meta = listed[(frame.qualname, variant)]
            try:
                variant_code = render_variant(index, variant, title, states[(index, variant)],
                                              frozenset(meta.policy_dropped), meta.by_name, renames,
                                              (seen or {}).get((frame.qualname, variant)),
                                              getattr(sys.modules.get(code.python_module), "__dict__", None), lookups)
            except Exception as exc:  # whatever stops a faithful rendering refuses the capture
                raise unrenderable_refusal(title, exc) from None
            rendered.append(variant_code)
            references |= variant_code.references
            names.append(variant_code.function)
        keys = [states[(index, v)].output_graph.name_of_builtins_dict_key_in_fglobals for v in range(len(names))]
        read = _read_in_module(entry, transformed, code.python_module)
        tables.append({
            "module": code.python_module,
            "name": code.python_code.co_name,
            "install_to_global": bool(code.install_to_global),
            "function_names": tuple(renames.get(n, n) for n in code.function_names) if code.install_to_global else (),
            "import_sources": {renames[alias]: module for alias, module in sorted(code.import_sources.items())},
            "aliases": {alias: renames[alias] for alias in sorted(code.import_sources)},
            "stand_ins": tuple(sorted(
                renames[alias] for alias, module in code.import_sources.items()
                if module == "torch._dynamo.utils" and read.get(alias, set()) <= DYNAMO_UTILS_STAND_IN
            )),
            "backend_ids": tuple(renames[b] for b in code.backend_ids),
            "builtins_keys": tuple(sorted({renames[k] for k in keys if k})),
            "bypassed": bool(code.bypassed),
            "compiled": bool(code.guarded_codes),
            "guards": tuple(names),
        })
    defaults = _defaults(fn)
    if defaults is None:
        remainder["defaults"] = {"defaults": fn.__defaults__, "kwdefaults": fn.__kwdefaults__}
    return StandaloneParts(frames=tables, defaults=defaults, blobs=blobs, rendered=rendered,
                           remainder=remainder, references=tuple(sorted(references)),
                           minted={name: renames[name] for name in stems if not name.startswith("__import_")})


def _blob(key: str, what: str, code: types.CodeType) -> CodeBlob:
    moved, first_line = line_free(code)
    return CodeBlob(key, what, marshal.dumps(moved), first_line)


def remainder_bytes(parts: StandaloneParts) -> bytes:
    """The opaque remainder pickled, or b"" when nothing is left opaque."""
    if not (parts.remainder["guards"] or parts.remainder["backends"] or "defaults" in parts.remainder):
        return b""
    return pickle.dumps(parts.remainder)
