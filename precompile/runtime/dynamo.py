"""DynamoTracer: record every frame Dynamo compiles while the caller's calls run, with its guards.

Built on Dynamo's own machinery: a CompilePackage records the entry, its graph-break continuations
and each guarded recompilation; PrecompileContext holds the compiled backends; our guard filter
records every guard's verdict (the summary's kept and dropped slots) as Dynamo asks for it.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import logging
import pickle
import re
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from precompile.codegen.render import render_dynamo
from precompile.errors import PrecompileError
from precompile.runtime import kernels
from precompile.runtime.tracers import DynamoTracer
from precompile.runtime.build import cache_for, qualified_name
from precompile.schema.codec import build_bundle
from precompile.schema.envelope import FORMAT_VERSION
from precompile.schema.metadata import DynamoFrame, DynamoMetadata, InlinedSource, VariantGuards
from precompile.schema.summary import PrecompileSummary

log = logging.getLogger("precompile")

# Guard types the serializer refuses, alone or as a type a guard's check derives (the default filter).
UNSERIALIZABLE = frozenset({"ID_MATCH", "CLOSURE_MATCH", "WEAKREF_ALIVE", "DICT_VERSION"})

_LOCAL = re.compile(r"L\['([^']+)'\]")
_active = threading.Lock()


def slot_source(name: str) -> str:
    """A guard's source with the local scope stripped: L['self'].act -> self.act; G[...] unchanged."""
    return _LOCAL.sub(r"\1", name)


def refuse_unsupported_fn(fn: Callable[..., Any]) -> None:
    """A Dynamo artifact rebuilds fn from its code object: fn must be a module-level function."""
    if isinstance(fn, functools.partial):
        raise PrecompileError("DynamoTracer takes the function itself, not a functools.partial; bind the arguments in a module-level def")
    if isinstance(fn, torch.nn.Module):
        raise PrecompileError(
            "DynamoTracer captures a function that CALLS the model, not the model itself; pass e.g. "
            "`def step(model, x): return model(x)` defined at module level, and the model as an argument"
        )
    if not isinstance(fn, types.FunctionType):
        raise PrecompileError(f"DynamoTracer captures a Python function, got {type(fn).__name__}; pass a module-level def")
    if fn.__name__ == "<lambda>":
        raise PrecompileError("DynamoTracer cannot capture a lambda; define fn with def at module level (MakeFxTracer takes lambdas)")
    if fn.__closure__:
        raise PrecompileError(
            f"DynamoTracer cannot capture {fn.__qualname__}: it closes over {list(fn.__code__.co_freevars)}; "
            "define it at module level and pass what it closes over as arguments"
        )
    if "<locals>" in fn.__qualname__:
        raise PrecompileError(f"DynamoTracer cannot capture {fn.__qualname__}, a nested function; define it at module level")
    if fn.__module__ == "__main__":
        raise PrecompileError(
            f"DynamoTracer cannot capture {fn.__qualname__}: it is defined in __main__, which a serving process cannot "
            "import; move it into an importable module"
        )


@dataclass
class _GuardLedger:
    """Every guard Dynamo offered the filter, as (type, source) slots with their verdicts.

    A dropped slot is risky when a custom filter dropped what the default keeps, or when it held
    different values across the compiles that dropped it (it told captured variants apart).
    """

    user_filter: Callable | None
    kept: set = field(default_factory=set)
    dropped: set = field(default_factory=set)
    risky: set = field(default_factory=set)
    values: dict = field(default_factory=dict)
    rendered: dict = field(default_factory=dict)

    def __call__(self, entries):
        default = [not (UNSERIALIZABLE & {e.guard_type, *e.derived_guard_types}) for e in entries]
        wanted = list(self.user_filter(entries)) if self.user_filter is not None else default
        if len(wanted) != len(entries):
            raise PrecompileError(f"guard_filter_fn returned {len(wanted)} flags for {len(entries)} guards; return one per guard")
        verdicts = []
        for entry, by_default, by_user in zip(entries, default, wanted):
            keep = bool(by_default and by_user)
            slot = (entry.guard_type, slot_source(entry.name))
            (self.kept if keep else self.dropped).add(slot)
            if by_default and not by_user:
                self.risky.add(slot)  # a custom filter dropped what the default keeps
            if not keep:
                value = _value_key(entry)
                if value is not None:
                    seen = self.values.setdefault(slot, set())
                    seen.add(value)
                    if len(seen) > 1:
                        self.risky.add(slot)
                code = getattr(entry.orig_guard, "code_list", None)
                if code and slot not in self.rendered:
                    self.rendered[slot] = _PROCESS_ID.sub("<id>", " ; ".join(dict.fromkeys(code)))
            verdicts.append(keep)
        return verdicts


_PROCESS_ID = re.compile(r"\b\d{9,}\b")
_IDENTITY_GUARDS = frozenset({"ID_MATCH", "CLOSURE_MATCH", "MODULE_MATCH", "BUILTIN_MATCH", "FUNCTION_MATCH", "NN_MODULE"})


def _value_key(entry) -> str | None:
    """What a dropped guard pinned, comparable across compiles; None where the value is data (tensors)."""
    if not entry.has_value or isinstance(entry.value, torch.Tensor):
        return None
    if entry.guard_type in _IDENTITY_GUARDS:
        return f"id {id(entry.value)}"
    try:
        return repr(entry.value)
    except Exception:  # noqa: BLE001 - an object whose repr fails still counts as one value
        return f"<{type(entry.value).__name__} {id(entry.value)}>"


class _TruncationLog(logging.Handler):
    """Records the frames Dynamo stopped recompiling at recompile_limit (it logs a warning for each)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.frames: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not str(record.msg).startswith("torch._dynamo hit config.") or len(record.args or ()) < 3:
            return
        match = re.match(r"'(.+)' \((.+):(\d+)\)", str(record.args[2]))
        if match is not None:
            name, filename, line = match.groups()
            frame = f"{name} ({Path(filename).name}:{line})"
            if frame not in self.frames:
                self.frames.append(frame)


# Kept guards that pin a value rather than a type or a shape.
_PINNING = frozenset({"CONSTANT_MATCH", "EQUALS_MATCH", "CONSTANT_SUBCLASS_MATCH", "COUNT_ITERATOR_MATCH", "RANGE_ITERATOR_MATCH"})


def wont_generalize(guards: list[VariantGuards]) -> tuple[str, ...]:
    """Bare argument names some variant pins to a value while no variant of that frame guards them
    without pinning: as captured, no variant serves another value of them."""
    by_frame: dict[str, list[tuple[set, set]]] = {}
    for variant in guards:
        slots = [check.partition(" ")[::2] for check in variant.checks]
        pinned = {src for kind, src in slots if kind in _PINNING and src and "." not in src and "[" not in src}
        by_frame.setdefault(variant.frame, []).append((pinned, {src for _, src in slots}))
    found = set()
    for variants in by_frame.values():
        for pinned, _ in variants:
            for source in pinned:
                if all(source in other_pinned for other_pinned, other_guarded in variants if source in other_guarded):
                    found.add(source)
    return tuple(sorted(found))


class DynamoSession:
    """One DynamoTracer capture: calls run compiled and are recorded; `build()` renders the pair."""

    def __init__(self, fn, tracer: DynamoTracer, backend: str, artifact_path: Path) -> None:
        # capture() has refused, up front, the functions and backends this session cannot take.
        self.fn = fn
        self.tracer = tracer
        self.backend = backend
        self.artifact_path = artifact_path
        self.calls = 0
        self.errors: list[str] = []
        self._stack = contextlib.ExitStack()
        self._ledger = _GuardLedger(tracer.guard_filter_fn)
        self._truncation = _TruncationLog()

    def __enter__(self) -> DynamoSession:
        from torch._dynamo.package import CompilePackage
        from torch._dynamo.precompile_context import PrecompileContext

        if not _active.acquire(blocking=False):
            raise PrecompileError("another DynamoTracer capture is active in this process; do not overlap them")
        self._stack.callback(_active.release)
        self.cache_dir, self.commands = self._stack.enter_context(kernels.private_inductor_cache())
        self._stack.enter_context(torch._dynamo.config.patch(recompile_limit=self.tracer.recompile_limit))
        dynamo_log = logging.getLogger("torch._dynamo.convert_frame")
        dynamo_log.addHandler(self._truncation)
        self._stack.callback(dynamo_log.removeHandler, self._truncation)
        self._stack.enter_context(
            torch._functorch.config.patch(force_non_lazy_backward_lowering=True, bundled_autograd_cache=True)
        )
        # Compiled code a previous compile left on fn (or on its continuations) would serve calls
        # without compiling, so nothing would be recorded: start from Dynamo's empty caches.
        torch._dynamo.reset()
        PrecompileContext.clear()
        self.package = CompilePackage(self.fn)
        self.compiled = torch._dynamo.optimize(
            backend=self.backend, package=self.package, guard_filter_fn=self._ledger, dynamic=self.tracer.dynamic
        )(self.fn)
        return self

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def __call__(self, *args, **kwargs):
        self.calls += 1
        try:
            return self.compiled(*args, **kwargs)
        except Exception as exc:
            message = f"{type(exc).__name__}: {exc}"
            if message not in self.errors:
                self.errors.append(message)
            raise

    # -- rendering -------------------------------------------------------------------------------
    def summary(self) -> PrecompileSummary:
        entry, frames, guards, backends = self._collect()
        return self._summary(entry, frames, backends, guards)

    def _collect(self):
        from torch._dynamo.package import load_guards_state
        from torch._dynamo.precompile_context import PrecompileContext

        entry = self.package.cache_entry()
        backends, frames, guards = {}, [], []
        for code in entry.codes:
            for backend_id in code.backend_ids:
                artifact = PrecompileContext.serialize_artifact_by_key(backend_id)
                if artifact is None:
                    code.bypassed = True
                else:
                    backends[backend_id] = artifact
            frames.append(
                DynamoFrame(
                    name=code.python_code.co_name, module=code.python_module, variants=len(code.guarded_codes),
                    resume_names=tuple(code.function_names) if code.install_to_global else (), bypassed=code.bypassed,
                )
            )
            for index, guarded in enumerate(code.guarded_codes):
                state = load_guards_state(guarded.guards_state)
                checks = sorted({f"{g.create_fn_name()} {slot_source(g.name)}".strip() for g in state.output_graph.guards})
                exprs = tuple(slot_source(e) for e in state.shape_code_parts.python_code_parts.exprs)
                guards.append(VariantGuards(frame=code.python_code.co_name, variant=index, checks=(*checks, *exprs)))
        return entry, frames, guards, backends

    def build(self) -> tuple[bytes, bytes]:
        entry, frames, guards, backends = self._collect()
        summary = self._summary(entry, frames, backends, guards)
        self._gate(summary)
        unreachable = [f"{f.name} ({f.module})" for f in frames[1:] if not f.resume_names and f.variants]
        if unreachable:
            raise PrecompileError(
                f"the capture compiled frames the entry reaches only by an ordinary call: {unreachable} (a graph "
                "break inside a child module's forward); a standalone artifact cannot serve them and the installed "
                "serving mode is not implemented yet. Remove the graph break there, or capture with MakeFxTracer"
            )
        metadata = DynamoMetadata(
            format_version=FORMAT_VERSION,
            backend=self.backend,
            torch_version=str(torch.__version__),
            python_version=tuple(sys.version_info[:2]),
            fn_name=qualified_name(self.fn),
            fn_module=self.fn.__module__,
            frames=tuple(frames),
            guards=tuple(guards),
            summary=summary,
            inlined_sources=tuple(
                InlinedSource(module=s.module, first_line=s.firstlineno, last_line=s.lastlineno, sha256=s.checksum)
                for s in sorted(entry.source_info.inlined_sources, key=lambda s: (s.module, s.firstlineno, s.lastlineno))
            ),
        )
        state = pickle.dumps(
            {"codes": entry.codes, "backends": backends, "defaults": self.fn.__defaults__, "kwdefaults": self.fn.__kwdefaults__}
        )
        source = render_dynamo(metadata, base64.b64encode(state).decode("ascii"), hashlib.sha256(state).hexdigest(), len(state))
        python_code = source.encode("utf-8")
        bundle, payload = build_bundle(
            kernels.collect_files(self.cache_dir), kernels.producer_keys(self.commands, self.cache_dir)
        )
        log.info("rendered a Dynamo artifact: %d frames, %d variants, %d bytes", len(frames), len(guards), len(python_code))
        return python_code, cache_for(python_code, backend=self.backend, tracer="dynamo", bundle=bundle, payload=payload)

    def _summary(self, entry, frames: list[DynamoFrame], backends: dict, guards: list[VariantGuards]) -> PrecompileSummary:
        kept, dropped = self._ledger.kept, self._ledger.dropped
        return PrecompileSummary(
            frames=len(frames),
            resume_functions=sum(1 for f in frames if f.resume_names),
            guarded_codes=sum(f.variants for f in frames),
            backend_graphs=len(backends),
            bypassed=tuple(f.name for f in frames if f.bypassed),
            truncated=tuple(self._truncation.frames),
            uncovered_frames=tuple(
                code.python_code.co_name
                for code in entry.codes
                if code.has_compile_id and not code.guarded_codes and not code.bypassed
            ),
            dropped_guards=tuple(sorted(dropped)),
            kept_guards=tuple(sorted(kept)),
            risky_dropped_guards=tuple(sorted(self._ledger.risky)),
            dropped_guard_code=tuple((t, src, check) for (t, src), check in sorted(self._ledger.rendered.items())),
            wont_generalize=wont_generalize(guards),
            capture_errors=tuple(self.errors),
        )

    def _gate(self, summary: PrecompileSummary) -> None:
        # A frame past recompile_limit ran eager and is only reported (truncated): the limit is the
        # caller's choice. A bypassed or uncovered frame, a call that raised or nothing compiled is a gap.
        gap = summary.bypassed or summary.uncovered_frames or summary.capture_errors or not (
            summary.guarded_codes and summary.backend_graphs
        )
        if self.tracer.require_complete and gap:
            raise PrecompileError(
                f"the capture is incomplete ({summary}); run calls that compile every frame, or pass "
                "DynamoTracer(require_complete=False) to write a partial artifact"
            )
        if self.tracer.require_no_risky_drops and summary.risky_dropped_guards:
            raise PrecompileError(
                f"the capture dropped guards that matter ({summary}); keep them in guard_filter_fn, or pass "
                "DynamoTracer(require_no_risky_drops=False)"
            )

