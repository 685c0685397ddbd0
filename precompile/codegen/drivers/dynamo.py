# Driver of a DynamoTracer artifact (precompile/codegen/drivers/dynamo.py, included verbatim).
# It builds each compiled subgraph from its source section above, rebuilds each captured variant's
# guard tree and transformed bytecode once, and seeds the names Dynamo minted (compiled graphs,
# continuations, import aliases, the builtins dict) into the captured module. What it checks with
# (each variant's guards, the inlined source) is the driver-checks and driver-sources sections above
# (drivers/dynamo_checks.py, drivers/source_checks.py).
# Standalone (SERVING_MODE "standalone"): every call goes to the first variant whose guards (rendered
# above as Python) pass; a continuation that compiled nothing runs as its original bytecode. Nothing
# is installed into torch.
# Installed ("installed": a graph break inside a function the captured code calls): each frame's
# variants are installed onto its live code object through Dynamo's hook for precompiled entries,
# and calls run under Dynamo's frame evaluator with a callback that refuses to compile.
# Either way nothing compiles (unless load allowed serve-time compiles): a call no variant covers raises.
import base64 as _base64
import hashlib as _hashlib
import importlib as _importlib
import inspect as _inspect
import itertools as _itertools
import keyword as _keyword
import marshal as _marshal
import os as _os
import pickle as _pickle
import re as _re
import sys as _sys
import types as _types
import typing as _typing

import torch

if "_torch_guards" not in globals():  # imported as a module of its own; python_code has the section above
    from precompile.codegen.drivers.dynamo_checks import (
        _RECAPTURE,
        PrecompileError,
        _builtins_dict,
        _fail,
        _RenderedGuards,
        _resolve_reference,
        _set_thread_count,
        _torch_guards,
    )
    from precompile.codegen.drivers.source_checks import _check_sources, _module

try:
    from precompile.errors import CallMismatch
except ImportError:  # served where only torch is installed: a twin of the same name

    class CallMismatch(PrecompileError):
        pass


def _check_versions(metadata, artifact):
    captured = tuple(metadata["PYTHON_VERSION"])
    if captured != tuple(_sys.version_info[:2]):
        _fail(artifact, f"it was captured on Python {captured[0]}.{captured[1]} and this is Python "
                        f"{_sys.version_info[0]}.{_sys.version_info[1]}; its bytecode only runs on the capturing version",
              "serve it with that Python, or capture it again here")
    if metadata["TORCH_VERSION"] != str(torch.__version__):
        _fail(artifact, f"it was captured with torch {metadata['TORCH_VERSION']} and this is torch {torch.__version__}; "
                        "its guard state is tied to that build", "serve it with that torch, or capture it again here")

# The attribute that marks what one loading of an artifact seeded (so loading it again may rebind it).
_ARTIFACT_TAG = "__precompile_artifact__"


def _seed(scope, name, value, tag, artifact, module_name):
    """Bind a Dynamo-minted name in the captured module, refusing to clobber someone else's.

    Values this artifact binds carry its tag, so loading the same artifact again rebinds them.
    """
    current = scope.get(name, value)
    if current is not value and getattr(current, _ARTIFACT_TAG, None) != tag:
        _fail(artifact, f"module {module_name} already binds {name!r}, a name this artifact must install "
                        "(a live torch.compile of the same code, or another artifact, minted it)",
              "load the artifact in a fresh process")
    scope[name] = value

def _empty_cells(code):
    """Cells standing in for a code object's free variables until a call brings the real closure."""
    return tuple(_types.CellType() for _ in code.co_freevars) or None

def _binder(code, name, defaults, kwdefaults):
    """A function with `code`'s signature and defaults that returns its arguments by name, defaults
    applied: Python's own argument binding, which the guards read as the frame's locals. A name that
    is no identifier (a comprehension's `.0`) can only be passed by position: it gets a stand-in."""
    names = code.co_varnames
    spelled = {n: n if n.isidentifier() and not _keyword.iskeyword(n) else f"_positional_{i}" for i, n in enumerate(names)}
    positional, kwonly = code.co_argcount, code.co_kwonlyargcount
    params = [spelled[n] for n in names[:positional]]
    if code.co_posonlyargcount:
        params.insert(code.co_posonlyargcount, "/")
    at = positional + kwonly
    star = names[at] if code.co_flags & _inspect.CO_VARARGS else None
    varkw = names[at + bool(star)] if code.co_flags & _inspect.CO_VARKEYWORDS else None
    params += [f"*{spelled[star]}" if star else ("*" if kwonly else ""), *(spelled[n] for n in names[positional:at]),
               f"**{spelled[varkw]}" if varkw else ""]
    arguments = [*names[:positional], *filter(None, [star]), *names[positional:at], *filter(None, [varkw])]
    source = (f"def _bind({', '.join(p for p in params if p)}):\n"
              f"    return {{{', '.join(f'{n!r}: {spelled[n]}' for n in arguments)}}}\n")
    namespace: dict = {}
    exec(compile(source, f"<precompile binder of {name}>", "exec"), namespace)  # text built from the code's own names
    binder = namespace["_bind"]
    binder.__name__ = binder.__qualname__ = name
    binder.__defaults__, binder.__kwdefaults__ = defaults, kwdefaults
    return binder


_CALL_REMEDY = "serve it the way it was captured (arguments, globals, grad mode, inference_mode, autocast), or capture this call too"
_LAYOUT_REMEDY = ("a tensor's memory layout (its strides) differs from every captured call's, and each captured graph is "
                  "specialized on it: capture a call with this layout too (call the capture once per layout you serve, "
                  "e.g. with x.to(memory_format=torch.channels_last) or the strided view you pass; each becomes a "
                  "variant), or pass contiguous tensors (.contiguous())")


class _Frame:
    """One captured code object: its variants (guards, then the transformed code) and how to call it."""

    def __init__(self, name, original, scope, defaults, kwdefaults, artifact, runs_as_python=False, bypassed=False,
                 runs_callees_inline=False, target=None):
        self.name = name
        self.label = self.name  # how a miss names the frame (build_forward sets its qualified name)
        self.artifact = artifact
        self.scope = scope
        self.original = original
        # The code object the guards are built for: the live one an installed frame serves from.
        self.target = self.original if target is None else target
        self.remedy = _CALL_REMEDY
        # A continuation that compiled nothing runs as its original bytecode, as during capture.
        self.runs_as_python = runs_as_python
        self.bypassed = bypassed
        # A frame run as Python that Dynamo did compile (to no graph) ran its callees inside its code.
        self.runs_callees_inline = runs_callees_inline
        self.defaults, self.kwdefaults = defaults, kwdefaults
        self.bind = _binder(self.original, self.name, defaults, kwdefaults)
        self.variants = []
        self.minted = []
        self.global_state_guards = []
        self.threads = torch.get_num_threads()

    def add_variant(self, guards, body_code):
        body = _types.FunctionType(body_code, self.scope, self.name, self.defaults, _empty_cells(body_code))
        body.__kwdefaults__ = self.kwdefaults
        self.variants.append((guards, body))

    def __call__(self, *args, **kwargs):
        return self.call(None, args, kwargs)

    def with_closure(self, closure):
        """What Dynamo's bytecode calls a continuation that has free variables through."""
        return lambda *args, **kwargs: self.call(closure, args, kwargs)

    def call(self, closure, args, kwargs):
        if self.runs_as_python:
            return _types.FunctionType(self.original, self.scope, self.name, None, closure)(*args, **kwargs)
        try:
            f_locals = self.bind(*args, **kwargs)
        except TypeError as exc:
            _fail(self.artifact, f"{self.name}() cannot take these arguments ({exc})", "call it as the captured fn", CallMismatch)
        self.update_threads()
        if closure:
            for name, cell in zip(self.original.co_freevars, closure):
                try:
                    f_locals[name] = cell.cell_contents
                except ValueError:  # an empty cell
                    pass
        for guards, body in self.variants:
            if guards.check(f_locals):
                if closure:
                    body = _types.FunctionType(body.__code__, body.__globals__, self.name, body.__defaults__, closure)
                return body(*args, **kwargs)
        self.miss(f_locals)

    def miss(self, f_locals):
        if not self.variants:
            _fail(self.artifact, f"frame {self.label!r} has no captured variant (it was bypassed during capture)",
                  "capture again with calls that compile it", CallMismatch)
        reasons = [f"variant {index}: {guards.explain(f_locals)}" for index, (guards, _) in enumerate(self.variants)]
        # Dynamo specializes each graph on its tensors' strides, as torch.compile does (it recompiles
        # for a new layout): a layout is served by a variant captured with it.
        remedy = self.remedy
        if any("stride mismatch" in reason for reason in reasons):
            remedy = _LAYOUT_REMEDY if remedy == _CALL_REMEDY else f"{_LAYOUT_REMEDY}; {remedy}"
        _fail(self.artifact, f"no captured variant of {self.label!r} covers this call ({len(self.variants)} captured): "
                             + " | ".join(reasons), remedy, CallMismatch)

    def update_threads(self):
        if self.global_state_guards and torch.get_num_threads() != self.threads:
            self.threads = torch.get_num_threads()
            for guard in self.global_state_guards:
                _set_thread_count(guard, self.threads)


def _pickled_frame(code, scope, defaults, kwdefaults, artifact, policy_dropped, by_name, modes, runs_as_python, target):
    """A frame from the pickled package entry (installed artifacts): torch's guard managers."""
    from torch._dynamo.package import SerializedCode

    original = SerializedCode.to_code_object(code.python_code)
    frame = _Frame(code.python_code.co_name, original, scope, defaults, kwdefaults, artifact, runs_as_python,
                   code.bypassed, bool(code.guarded_codes), target)
    for index, guarded in enumerate(() if runs_as_python else code.guarded_codes):
        guards, global_state, builtins_key = _torch_guards(
            guarded.guards_state, frame.target, scope, policy_dropped.get(index, ()), by_name.get(index, ()), artifact,
            modes.get(index, ()))
        frame.global_state_guards.append(global_state)
        if builtins_key:
            frame.minted.append(builtins_key)
        frame.add_variant(guards, SerializedCode.to_code_object(guarded.dynamo_code))
    return frame


# Where AOTAutograd's bundled result keeps each lowered graph's output module.
_AOT_PARTS = (("forward", "compiled_fw"), ("backward", "compiled_bw"))


def _load_subgraph(subgraph, namespace, state):
    """The callable Dynamo's bytecode calls for one compiled subgraph, built from python_code."""
    forward = namespace[subgraph["forward"]]
    if callable(forward):
        return forward  # eager: the ATen function above, as written
    aot = state["backends"][subgraph["backend_id"]]
    for key, attribute in _AOT_PARTS:
        name = subgraph.get(key)
        if not name:
            continue
        result = getattr(aot.content, attribute).result
        result.source_code = namespace[name]
        # Inductor loads an output module from a file named by its cache key: name it by the text
        # written here, so what runs is what python_code says, whatever a cache dir already holds.
        result.cache_key = "p" + _hashlib.sha256(result.source_code.encode("utf-8")).hexdigest()
    return aot.after_deserialization()


def _configure_inductor_for_aotautograd(metadata):
    """Where AOTAutograd serves a subgraph (its output module is written here as a string), Inductor
    loads the module's kernels: load hands it the bundle's by source, and any it lacks it compiles
    here, without precompiled headers, as the kernel runtime does. Lowered subgraphs need none of
    this, so Inductor is not imported for them."""
    if any(isinstance(metadata.get(subgraph["forward"]), str) for subgraph in metadata["SUBGRAPHS"]):
        import torch._inductor.config as inductor_config

        inductor_config.cpp_cache_precompile_headers = False


def _artifact_tag(raw_state, namespace):
    """What tells this artifact's seeded names from another's: its opaque state and its subgraphs'
    code, so loading the same artifact again may rebind them and a different one may not."""
    digest = _hashlib.sha256(raw_state)
    for subgraph in namespace["SUBGRAPHS"]:
        for key in ("forward", "backward"):
            value = namespace.get(subgraph.get(key) or "")
            value = getattr(value, "__precompile_source__", value)  # a lowered subgraph: its module text
            if isinstance(value, str):
                digest.update(value.encode("utf-8"))
            elif value is not None:
                digest.update(_marshal.dumps(value.__code__))
    return digest.hexdigest()[:16]

def _state_bytes(state_blob, artifact, optional):
    """The pickle the opaque state holds. precompile writes it as one base64 str literal (None, when
    `optional`, where nothing is pickled) and inspect scans exactly that; anything else is refused.
    (No string here names the state's variable: inspect takes any string naming it for a write.)"""
    if state_blob is None and optional:
        return b""
    if type(state_blob) is not str:
        _fail(artifact, f"its opaque state is a {type(state_blob).__name__}, not the base64 str "
                        "literal precompile writes (and inspect scans)", _RECAPTURE)
    try:
        return _base64.b64decode(state_blob, validate=True)
    except ValueError as exc:  # binascii.Error: a character outside the alphabet, or bad padding
        _fail(artifact, f"its opaque state is not strict base64 ({exc})", _RECAPTURE)


def build_forward(metadata, state_blob, artifact="this artifact", variant_guards=()):
    """The served entry of a Dynamo artifact, from its metadata literals, subgraphs and opaque state.
    `variant_guards`: each variant's guard list, whose policy the pickled guard state is filtered by
    (python_code passes it where it has pickled guards; a standalone artifact's guards are rendered)."""
    _check_versions(metadata, artifact)
    if "_dynamo_frames" in metadata:
        return _build_standalone(metadata, state_blob, artifact)
    raw = _state_bytes(state_blob, artifact, optional=False)
    import torch._dynamo  # guard trees and backends need Dynamo loaded

    installed = metadata.get("SERVING_MODE") == "installed"
    if installed:
        _check_dynamo_serves(artifact)
    _check_sources(metadata, artifact)

    _configure_inductor_for_aotautograd(metadata)
    tag = _artifact_tag(raw, metadata)
    state = _pickle.loads(raw)
    backends = {}
    for subgraph in metadata["SUBGRAPHS"]:
        backend = torch._dynamo.disable(_load_subgraph(subgraph, metadata, state))
        setattr(backend, _ARTIFACT_TAG, tag)
        backends[subgraph["backend_id"]] = backend
    entry = None
    frames = []
    minted = []
    for index, code in enumerate(state["codes"]):
        module = _module(code.python_module, artifact)
        scope = module.__dict__
        described = metadata["FRAMES"][index]
        is_entry = index == 0
        target = _live_code(code, described, module, artifact, is_entry) if installed else None
        for alias, module_name in code.import_sources.items():
            _seed(scope, alias, _importlib.import_module(module_name), tag, artifact, module.__name__)
        for backend_id in code.backend_ids:
            _seed(scope, backend_id, backends[backend_id], tag, artifact, module.__name__)
        variants = [v for v in variant_guards if v["frame"] == described.get("qualname", code.python_code.co_name)]
        policy_dropped = {variant["variant"]: frozenset(variant.get("policy_dropped", ())) for variant in variants}
        by_name = {variant["variant"]: variant.get("by_name", ()) for variant in variants}
        modes = {variant["variant"]: tuple(variant.get("dispatch_modes", ())) for variant in variants}
        frame = _pickled_frame(code, scope, state["defaults"] if is_entry else None,
                               state["kwdefaults"] if is_entry else None, artifact, policy_dropped, by_name, modes,
                               described.get("runs_as_python", False), target)
        frame.label = described.get("qualname") or frame.name
        frames.append(frame)
        if is_entry:
            entry = frame
        minted += [*code.backend_ids, *code.function_names, *frame.minted]
        if code.install_to_global:
            continuation = _continuation(frame, code, installed)
            setattr(continuation, _ARTIFACT_TAG, tag)
            for name in code.function_names:
                _seed(scope, name, continuation, tag, artifact, module.__name__)
    _reserve_minted_names(minted)
    if not installed:
        return entry
    _install(frames, tag, artifact)
    live_fn = _qualified(_module(metadata["FN_MODULE"], artifact), metadata["FRAMES"][0]["qualname"])
    allow_compiles = metadata.get("__precompile_allow_serve_time_compiles__", False)
    return _Installed(live_fn, frames, metadata["BACKEND"], artifact, allow_compiles)


# -- standalone serving ----------------------------------------------------------------------------


def _marshalled(metadata, key, artifact):
    """The bytes of a marshalled code object, refused unless they are the base64 str precompile writes
    and (when load seeded the labels python_code shows, __precompile_bytecode_sha256__) match their sha256."""
    text = metadata["_dynamo_bytecode"][key]
    if type(text) is not str:
        _fail(artifact, f"its marshalled code {key!r} is a {type(text).__name__}, not the base64 str precompile writes", _RECAPTURE)
    try:
        data = _base64.b64decode(text, validate=True)
    except ValueError as exc:
        _fail(artifact, f"its marshalled code {key!r} is not strict base64 ({exc})", _RECAPTURE)
    labels = metadata.get("__precompile_bytecode_sha256__")
    digest = _hashlib.sha256(data).hexdigest()
    if labels is not None and labels.get(key) != digest:
        _fail(artifact, f"its marshalled code {key!r} has sha256 {digest}, but python_code labels it "
                        f"{labels.get(key) or 'with nothing'}: the code was swapped", _RECAPTURE)
    return data


def _code_object(metadata, key, filename, artifact):
    """A code object python_code carries marshalled (the Bytecode section), by its key, with the
    serving process's file of its module named in it and its nested code, moved to the line it starts
    on (marshalled as if from line 1; an artifact without _dynamo_first_lines marshalled it in place):
    tracebacks point there."""
    first = metadata.get("_dynamo_first_lines", {}).get(key, 1)
    if type(first) is not int or not 1 <= first < 2**31:
        _fail(artifact, f"its code {key!r} starts on line {first!r}, not a line number", _RECAPTURE)
    shift = first - 1

    def moved(name):  # a continuation is named after the line it resumes at
        if not shift or not name.startswith("torch_dynamo_resume_in_"):
            return name
        return _re.sub(r"(?<=_at_)\d+", lambda line: str(int(line.group(0)) + shift), name)

    def named(code):
        consts = tuple(named(c) if isinstance(c, _types.CodeType) else c for c in code.co_consts)
        code = code.replace(co_filename=filename, co_consts=consts, co_firstlineno=code.co_firstlineno + shift,
                            co_name=moved(code.co_name))
        qualname = getattr(code, "co_qualname", None)
        return code.replace(co_qualname=moved(qualname)) if qualname else code

    return named(_marshal.loads(_marshalled(metadata, key, artifact)))


def _resolve_references(metadata, artifact):
    """Resolve, once at load, every object the rendered guards compare with by name."""
    for ref in metadata.get("_dynamo_references", ()):
        try:
            metadata["_by_name"][ref] = _resolve_reference(ref)
        except Exception as exc:  # the named object is not here: the guards cannot run
            _fail(artifact, f"its guards compare with {ref}, which does not resolve here ({type(exc).__name__}: {exc})",
                  "serve it with the code it was captured from")


def _standalone_tag(metadata, raw_state, artifact):
    """What tells this artifact's seeded names from another's: its bytecode, opaque remainder and
    subgraphs' code (loading the same artifact again may rebind them, a different one may not).
    Every marshalled blob is checked here, before anything is built from any of them."""
    digest = _hashlib.sha256(raw_state)
    for key in sorted(metadata["_dynamo_bytecode"]):
        digest.update(key.encode("utf-8") + _marshalled(metadata, key, artifact))
    return _artifact_tag(digest.digest(), metadata)


class _DynamoUtils:
    """Stands in for torch._dynamo.utils where Dynamo's transformed bytecode reads only these from it:
    the profiler range around a compiled graph and a tensor's size or stride read as a call. Each does
    what torch's does, without importing Dynamo."""

    @staticmethod
    def record_pregraph_bytecode_enter():
        import contextlib

        profiling = torch.autograd.profiler._is_profiler_enabled
        cm = torch._C._profiler._RecordFunctionFast("Pregraph bytecode") if profiling else contextlib.nullcontext()
        cm.__enter__()
        return cm

    @staticmethod
    def record_pregraph_bytecode_exit(cm):
        cm.__exit__(None, None, None)

    @staticmethod
    def call_size(x, i):
        return x.size(i)

    @staticmethod
    def call_stride(x, i):
        return x.stride(i)

    @staticmethod
    def call_storage_offset(x):
        return x.storage_offset()


def _build_standalone(metadata, state_blob, artifact):
    """A standalone artifact whose code objects travel marshalled and whose every guard is rendered
    above; what python_code keeps opaque (the remainder it names) is AOTAutograd's wrappers and fn's
    defaults that are not literals, never guard state."""
    raw = _state_bytes(state_blob, artifact, optional=True)
    _check_sources(metadata, artifact)
    remainder = _pickle.loads(raw) if raw else {"backends": {}}
    _configure_inductor_for_aotautograd(metadata)
    tag = _standalone_tag(metadata, raw, artifact)
    _resolve_references(metadata, artifact)
    backends = {}
    for subgraph in metadata["SUBGRAPHS"]:
        backend = _load_subgraph(subgraph, metadata, remainder)
        if "torch._dynamo" in _sys.modules:  # a frame evaluator may be active: never trace into a subgraph
            backend = _sys.modules["torch._dynamo"].disable(backend)
        setattr(backend, _ARTIFACT_TAG, tag)
        backends[subgraph["backend_id"]] = backend
    stand_in = _DynamoUtils()
    setattr(stand_in, _ARTIFACT_TAG, tag)  # loading this artifact again may rebind it
    defaults = metadata["_dynamo_defaults"] or remainder["defaults"]  # None: not literals, kept opaque
    entry = None
    for index, table in enumerate(metadata["_dynamo_frames"]):
        module = _module(table["module"], artifact)
        scope = module.__dict__
        described = metadata["FRAMES"][index]
        for alias, module_name in table["import_sources"].items():
            bound = stand_in if alias in table["stand_ins"] else _importlib.import_module(module_name)
            _seed(scope, alias, bound, tag, artifact, module.__name__)
        for name in table["backend_ids"]:
            _seed(scope, name, backends[name], tag, artifact, module.__name__)
        for key in table["builtins_keys"]:
            _seed(scope, key, _builtins_dict(scope), tag, artifact, module.__name__)
        filename = getattr(module, "__file__", None) or f"<module {module.__name__}>"
        original = _code_object(metadata, str(index), filename, artifact)
        frame = _Frame(table["name"], original, scope, defaults["defaults"] if index == 0 else None,
                       defaults["kwdefaults"] if index == 0 else None, artifact,
                       described.get("runs_as_python", False), table["bypassed"], table["compiled"])
        frame.label = described.get("qualname") or frame.name
        for variant, guards_name in enumerate(() if frame.runs_as_python else table["guards"]):
            guards = _RenderedGuards(metadata[guards_name], scope)
            frame.add_variant(guards, _code_object(metadata, f"{index}.{variant}", filename, artifact))
        if index == 0:
            entry = frame
        if table["install_to_global"]:
            continuation = frame if not original.co_freevars else (lambda closure, _frame=frame: _frame.with_closure(closure))
            setattr(continuation, _ARTIFACT_TAG, tag)
            for name in table["function_names"]:
                _seed(scope, name, continuation, tag, artifact, module.__name__)
    return entry


def _continuation(frame, code, installed):
    """What Dynamo's bytecode calls a continuation by: standalone, our dispatcher; installed, a plain
    function over the code object its variants are installed on (with free variables, a factory
    taking the closure, as Dynamo binds it)."""
    if not installed:
        if not code.python_code.co_freevars:
            return frame
        return lambda closure, _frame=frame: _frame.with_closure(closure)
    if code.python_code.co_freevars:
        return lambda closure, _frame=frame: _types.FunctionType(_frame.target, _frame.scope, _frame.name, None, closure)
    return _types.FunctionType(frame.target, frame.scope, frame.name)


# -- installed serving -----------------------------------------------------------------------------


def _check_dynamo_serves(artifact):
    """An installed artifact serves through Dynamo's frame evaluator, and nothing may compile beside it."""
    if torch._dynamo.config.compiled_autograd:
        _fail(artifact, "torch._dynamo.config.compiled_autograd is enabled, which would compile backward graphs "
                        "outside the artifact", "turn compiled autograd off before loading an installed artifact")
    from torch._utils_internal import justknobs_check

    switches = [
        ("TORCHDYNAMO_DISABLE=1", _os.environ.get("TORCHDYNAMO_DISABLE", "") == "1"),
        ("torch._dynamo.config.disable (TORCH_COMPILE_DISABLE=1)", bool(torch._dynamo.config.disable)),
        ("the pytorch/compiler:enable_dynamo killswitch", not justknobs_check("pytorch/compiler:enable_dynamo")),
    ]
    off = [name for name, disabled in switches if disabled]
    if off:
        _fail(artifact, f"Dynamo is disabled here ({', '.join(off)}), and an installed artifact serves through "
                        "Dynamo's frame evaluator", "enable Dynamo in the serving process")


def _qualified(module, qualname):
    value = module
    for part in qualname.split("."):
        value = getattr(value, part)
    return value


def _live_code(code, described, module, artifact, is_entry):
    """The live code object an installed frame serves from, found by module and qualified name;
    refused when its source changed since capture (the variants were compiled from the old one) or
    when a live compile in this process already serves it."""
    from torch._dynamo.package import SerializedCode, _lookup_code

    where = f"{module.__name__}.{described['qualname']} (line {described['first_line']})"
    if code.install_to_global:
        return None  # a continuation: its code object travels in the artifact
    try:
        live = _qualified(module, described["qualname"]).__code__ if is_entry else _lookup_code(code)
    except Exception as exc:  # whatever stops the lookup, the frame is not there
        _fail(artifact, f"it installs onto {where}, which this process does not have ({type(exc).__name__}: {exc})",
              "serve it with the code it was captured from")
    if _placeless(live) != _placeless(SerializedCode.to_code_object(code.python_code)):
        _fail(artifact, f"the code of {where} changed since capture (its variants were compiled from the old code)",
              "capture the artifact again from the current source")
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    if _debug_get_cache_entry_list(live):
        _fail(artifact, f"{where} already has live Dynamo cache entries (something compiled it in this process)",
              "load the artifact in a fresh process")
    return live


def _placeless(code):
    """A code object with where it sits taken out (its first line and line table, its nested code's
    too): code moved down its file, or with a comment or blank line added inside, is the same code."""
    consts = tuple(_placeless(c) if isinstance(c, _types.CodeType) else c for c in code.co_consts)
    return code.replace(co_firstlineno=1, co_linetable=b"", co_consts=consts)


def _install(frames, tag, artifact):
    """Install each frame's variants onto its code object through Dynamo's hook for precompiled
    entries (`_live_code` refused a frame a live compile already serves). Another installed
    artifact's entries on the same code may stay: every entry was compiled from that very code, and
    its guards decide."""
    from torch._C._dynamo.eval_frame import _load_precompile_entry

    for frame in frames:
        frame.remedy = "capture this call too, or load with allow_serve_time_compiles=True"
        installed = frame.scope.setdefault("__precompile_installed__", {})
        tags = installed.setdefault(f"{frame.target.co_qualname}:{frame.target.co_firstlineno}", set())
        if tag in tags:
            continue  # this artifact was loaded before: its entries are there
        tags.add(tag)
        if frame.runs_as_python:
            _run_as_python(frame.target, recursive=frame.runs_callees_inline)
            continue
        for guards, body in frame.variants:
            _load_precompile_entry(frame.target, guards.manager, body.__code__)


def _run_as_python(code, recursive):
    """Let Dynamo's frame evaluator run a frame as its original bytecode. A frame Dynamo gave up on in
    the capture (no variant) ran that way with the frames it calls intercepted on their own: skip it
    alone. A frame that compiled to no graph ran its calls inside its transformed code, never as frames
    of their own: skip them with it, so none of them reaches the refusing callback."""
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy, set_code_exec_strategy

    inner = _FrameAction.SKIP if recursive else _FrameAction.DEFAULT
    set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, inner))


class _Installed:
    """The served entry of an installed artifact: calls fn under Dynamo's frame evaluator, whose
    precompiled entries serve the captured variants, with a callback that refuses to compile.

    The process-wide stance still decides what a missed call does: under "force_eager" nothing is
    intercepted, under "eager_on_recompile" misses run eagerly, and every stance that would compile
    is refused, unless load allowed serve-time compiles (then it compiles as torch.compile would).
    """

    installed = True

    def __init__(self, fn, frames, backend, artifact, allow_compiles):
        self.fn = fn
        self.artifact = artifact
        self.frames = {frame.target: frame for frame in frames}
        self.threads = torch.get_num_threads()
        # Bound once at load, not looked up on every served call.
        from torch._C._dynamo.eval_frame import set_eval_frame
        from torch._dynamo import eval_frame

        self.set_eval_frame, self.eval_frame = set_eval_frame, eval_frame
        compiling = torch._dynamo.optimize(backend) if allow_compiles else None
        self.compile = compiling.callback if isinstance(compiling, eval_frame.OptimizeContext) else None

    def __call__(self, *args, **kwargs):
        set_eval_frame, eval_frame = self.set_eval_frame, self.eval_frame
        stance = eval_frame._stance.stance
        callback: _typing.Callable[..., _typing.Any] | bool | None
        if stance == "force_eager":
            callback = None
        elif stance == "eager_on_recompile":
            callback = False  # Dynamo's run-only mode: precompiled entries serve, misses run eagerly
        elif self.compile is not None:
            callback = eval_frame._callback_from_stance(self.compile)
        else:
            callback = self.refuse
        if torch.get_num_threads() != self.threads:
            self.threads = torch.get_num_threads()
            for frame in self.frames.values():
                frame.update_threads()
        prior = set_eval_frame(None)
        try:
            set_eval_frame(callback)
            return self.fn(*args, **kwargs)
        finally:
            set_eval_frame(prior)

    def refuse(self, frame, cache_entry, frame_state):
        """Dynamo's callback for a frame no installed entry served: what it would skip runs as it is;
        a captured frame names each variant's failing guard; anything else it would compile is refused."""
        from torch._dynamo import convert_frame, trace_rules
        from torch._dynamo.types import ConvertFrameReturn

        captured = self.frames.get(frame.f_code)
        if captured is not None:
            captured.miss(frame.f_locals)
        if trace_rules.check(frame.f_code) or not convert_frame.has_tensor_in_frame(frame):
            return ConvertFrameReturn()
        code = frame.f_code
        _fail(self.artifact, f"the call reached {code.co_qualname} ({code.co_filename}:{code.co_firstlineno}), a "
                             "frame the capture never compiled, and an installed artifact compiles nothing",
              "capture this call too, or load with allow_serve_time_compiles=True", CallMismatch)


_MINTED_NUMBER = r"^__\w*?_(\d+)(?:_[0-9a-f_]{36})?$"


def _reserve_minted_names(names):
    """Dynamo numbers the globals it mints (compiled graphs, continuations, the builtins dict) from one
    process-wide counter. Move it past the numbers this artifact seeded, so a live compile later in
    this process never mints a name the artifact holds (Dynamo asserts the name is free)."""
    from torch._dynamo import bytecode_transformation

    numbers = [int(match.group(1)) for match in (_re.match(_MINTED_NUMBER, name) for name in names) if match]
    if numbers:
        current = next(bytecode_transformation._unique_id_counter)
        bytecode_transformation._unique_id_counter = _itertools.count(max(current, max(numbers) + 1))
