# Driver of a DynamoTracer artifact (precompile/codegen/drivers/dynamo.py, included verbatim).
# It builds each compiled subgraph from its source section above, rebuilds each captured variant's
# guard tree and transformed bytecode once, seeds the names Dynamo minted (compiled graphs,
# continuations, import aliases, the builtins dict) into the captured module, and dispatches every
# call to the first variant whose guards pass; a continuation that compiled nothing runs as its
# original bytecode. Nothing is installed into torch and nothing compiles: a call no variant covers raises.
import base64 as _base64
import hashlib as _hashlib
import importlib as _importlib
import inspect as _inspect
import itertools as _itertools
import json as _json
import marshal as _marshal
import pickle as _pickle
import re as _re
import sys as _sys
import types as _types

import torch

try:
    from precompile.errors import PrecompileError
except ImportError:  # served where only torch is installed

    class PrecompileError(RuntimeError):
        pass


def _fail(artifact, message, remedy):
    raise PrecompileError(f"{artifact}: {message}; {remedy}")


def _check_versions(metadata, artifact):
    captured = tuple(metadata["PYTHON_VERSION"])
    if captured != tuple(_sys.version_info[:2]):
        _fail(artifact, f"it was captured on Python {captured[0]}.{captured[1]} and this is Python "
                        f"{_sys.version_info[0]}.{_sys.version_info[1]}; its bytecode only runs on the capturing version",
              "serve it with that Python, or capture it again here")
    if metadata["TORCH_VERSION"] != str(torch.__version__):
        _fail(artifact, f"it was captured with torch {metadata['TORCH_VERSION']} and this is torch {torch.__version__}; "
                        "its guard state is tied to that build", "serve it with that torch, or capture it again here")


def _check_sources(metadata, artifact):
    """The code Dynamo inlined must still say what it said at capture: guards do not check it."""
    from torch._dynamo.package import _hash_sourcelines

    for source in metadata.get("INLINED_SOURCES", ()):
        module = _module(source["module"], artifact)
        try:
            now = _hash_sourcelines(module, source["first_line"], source["last_line"])
        except (OSError, TypeError):
            now = None
        if now != source["sha256"]:
            _fail(artifact, f"the source of {source['module']} lines {source['first_line']}-{source['last_line']} "
                            "changed since capture (its compiled graphs may no longer match it)",
                  "capture the artifact again from the current source")


def _module(name, artifact):
    if name == "__main__":
        _fail(artifact, "it captured code defined in __main__, which another process cannot import",
              "define fn in an importable module and capture again")
    try:
        return _importlib.import_module(name)
    except ImportError as exc:
        _fail(artifact, f"its code lives in module {name!r}, which cannot be imported here ({exc})",
              "serve it where that module is importable")


def _seed(scope, name, value, tag, artifact, module_name):
    """Bind a Dynamo-minted name in the captured module, refusing to clobber someone else's.

    Values this artifact binds carry its tag, so loading the same artifact again rebinds them.
    """
    current = scope.get(name, value)
    if current is not value and getattr(current, "__precompile_artifact__", None) != tag:
        _fail(artifact, f"module {module_name} already binds {name!r}, a name this artifact must install "
                        "(a live torch.compile of the same code, or another artifact, minted it)",
              "load the artifact in a fresh process")
    scope[name] = value


def _set_thread_count(guard, threads):
    """The GLOBAL_STATE guard pins torch.get_num_threads(); the driver keeps it at the current count,
    so serving with another thread count matches while grad mode and the rest stay checked."""
    state = _json.loads(guard.__getstate__())
    state["num_threads"] = threads
    guard.__setstate__(_json.dumps(state))


_LOCAL = _re.compile(r"L\['([^']+)'\]")


def _drop_guards(state, slots):
    """Take the invariance policy's slots ("GUARD_TYPE source", listed in GUARDS) out of a variant."""
    if not slots:
        return
    guards = state.output_graph._guards
    guards.inner = type(guards.inner)(guard for guard in guards.inner if _slot_text(guard) not in slots)


def _slot_text(guard):
    return (guard.create_fn_name() + " " + _LOCAL.sub(r"\1", guard.name)).strip()


class _Frame:
    """One captured code object: its variants and how to call it."""

    def __init__(self, code, scope, defaults, kwdefaults, artifact, policy_dropped, runs_as_python=False):
        from torch._dynamo.package import SerializedCode, load_guard_manager, load_guards_state

        self.name = code.python_code.co_name
        self.artifact = artifact
        self.scope = scope
        self.original = SerializedCode.to_code_object(code.python_code)
        # A continuation that compiled nothing runs as its original bytecode, as during capture.
        self.runs_as_python = runs_as_python
        signature_fn = _types.FunctionType(self.original, {}, self.name, defaults)
        signature_fn.__kwdefaults__ = kwdefaults
        self.signature = _inspect.signature(signature_fn)
        self.variants = []
        self.minted = []
        self.global_state_guards = []
        self.threads = torch.get_num_threads()
        for index, guarded in enumerate(() if runs_as_python else code.guarded_codes):
            state = load_guards_state(guarded.guards_state)
            _drop_guards(state, policy_dropped.get(index, ()))
            self.global_state_guards.append(state.output_graph.global_state_guard)
            _set_thread_count(state.output_graph.global_state_guard, self.threads)
            builtins_key = state.output_graph.name_of_builtins_dict_key_in_fglobals
            if builtins_key:
                self.minted.append(builtins_key)
                from torch._dynamo.output_graph import get_builtins_dict

                builtins_dict = get_builtins_dict(scope)
                if scope.setdefault(builtins_key, builtins_dict) is not builtins_dict:
                    _fail(artifact, f"module binds {builtins_key!r} to something other than its builtins dict",
                          "load the artifact in a fresh process")
            manager = load_guard_manager(state, self.original, scope)
            body = _types.FunctionType(SerializedCode.to_code_object(guarded.dynamo_code), scope, self.name, defaults)
            body.__kwdefaults__ = kwdefaults
            self.variants.append((manager, body))

    def __call__(self, *args, **kwargs):
        return self.call(None, args, kwargs)

    def with_closure(self, closure):
        """What Dynamo's bytecode calls a continuation that has free variables through."""
        return lambda *args, **kwargs: self.call(closure, args, kwargs)

    def call(self, closure, args, kwargs):
        if self.runs_as_python:
            return _types.FunctionType(self.original, self.scope, self.name, None, closure)(*args, **kwargs)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            _fail(self.artifact, f"{self.name}() cannot take these arguments ({exc})", "call it as the captured fn")
        bound.apply_defaults()
        f_locals = dict(bound.arguments)
        if torch.get_num_threads() != self.threads:
            self.threads = torch.get_num_threads()
            for guard in self.global_state_guards:
                _set_thread_count(guard, self.threads)
        if closure:
            for name, cell in zip(self.original.co_freevars, closure):
                try:
                    f_locals[name] = cell.cell_contents
                except ValueError:  # an empty cell
                    pass
        for manager, body in self.variants:
            if manager.check(f_locals):
                if closure:
                    body = _types.FunctionType(body.__code__, body.__globals__, self.name, body.__defaults__, closure)
                return body(*args, **kwargs)
        self.miss(f_locals)

    def miss(self, f_locals):
        if not self.variants:
            _fail(self.artifact, f"frame {self.name!r} has no captured variant (it was bypassed during capture)",
                  "capture again with calls that compile it")
        reasons = []
        for index, (manager, _) in enumerate(self.variants):
            failed = [part.strip() for part in manager.check_verbose(f_locals).verbose_code_parts if part.strip()]
            reasons.append(f"variant {index}: {'; '.join(failed[:2]) or 'a guard failed'}")
        _fail(self.artifact, f"no captured variant of {self.name!r} covers this call ({len(self.variants)} captured): "
                             + " | ".join(reasons),
              "serve it the way it was captured (arguments, globals, grad mode), or capture this call too")


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


def _artifact_tag(raw_state, namespace):
    """What tells this artifact's seeded names from another's: its opaque state and its subgraphs'
    code, so loading the same artifact again may rebind them and a different one may not."""
    digest = _hashlib.sha256(raw_state)
    for subgraph in namespace["SUBGRAPHS"]:
        for key in ("forward", "backward"):
            value = namespace.get(subgraph.get(key) or "")
            if isinstance(value, str):
                digest.update(value.encode("utf-8"))
            elif value is not None:
                digest.update(_marshal.dumps(value.__code__))
    return digest.hexdigest()[:16]


def build_forward(metadata, state_blob, artifact="this artifact"):
    """The served entry of a Dynamo artifact, from its metadata literals, subgraphs and opaque state."""
    _check_versions(metadata, artifact)
    import torch._dynamo  # noqa: F401 - guard trees and backends need Dynamo loaded

    _check_sources(metadata, artifact)

    if metadata["BACKEND"] == "inductor":
        import torch._inductor.config as inductor_config

        # Precompiled headers are part of every kernel's cache key; artifacts are captured without them.
        inductor_config.cpp_cache_precompile_headers = False
    raw = _base64.b64decode(state_blob)
    tag = _artifact_tag(raw, metadata)
    state = _pickle.loads(raw)
    backends = {}
    for subgraph in metadata["SUBGRAPHS"]:
        backend = torch._dynamo.disable(_load_subgraph(subgraph, metadata, state))
        backend.__precompile_artifact__ = tag
        backends[subgraph["backend_id"]] = backend
    entry = None
    minted = []
    for index, code in enumerate(state["codes"]):
        module = _module(code.python_module, artifact)
        scope = module.__dict__
        for alias, module_name in code.import_sources.items():
            _seed(scope, alias, _importlib.import_module(module_name), tag, artifact, module.__name__)
        for backend_id in code.backend_ids:
            _seed(scope, backend_id, backends[backend_id], tag, artifact, module.__name__)
        is_entry = index == 0
        policy_dropped = {
            variant["variant"]: frozenset(variant.get("policy_dropped", ()))
            for variant in metadata["GUARDS"] if variant["frame"] == code.python_code.co_name
        }
        frame = _Frame(code, scope, state["defaults"] if is_entry else None,
                       state["kwdefaults"] if is_entry else None, artifact, policy_dropped,
                       metadata["FRAMES"][index].get("runs_as_python", False))
        if is_entry:
            entry = frame
        minted += [*code.backend_ids, *code.function_names, *frame.minted]
        if code.install_to_global:
            if code.python_code.co_freevars:
                def dispatcher(closure, _frame=frame):
                    return _frame.with_closure(closure)
            else:
                dispatcher = frame
            dispatcher.__precompile_artifact__ = tag
            for name in code.function_names:
                _seed(scope, name, dispatcher, tag, artifact, module.__name__)
    _reserve_minted_names(minted)
    return entry


_MINTED_NUMBER = _re.compile(r"^__\w*?_(\d+)(?:_[0-9a-f_]{36})?$")


def _reserve_minted_names(names):
    """Dynamo numbers the globals it mints (compiled graphs, continuations, the builtins dict) from one
    process-wide counter. Move it past the numbers this artifact seeded, so a live compile later in
    this process never mints a name the artifact holds (Dynamo asserts the name is free)."""
    from torch._dynamo import bytecode_transformation

    numbers = [int(match.group(1)) for match in map(_MINTED_NUMBER.match, names) if match]
    if numbers:
        current = next(bytecode_transformation._unique_id_counter)
        bytecode_transformation._unique_id_counter = _itertools.count(max(current, max(numbers) + 1))
