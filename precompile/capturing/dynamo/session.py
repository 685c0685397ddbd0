"""DynamoTracer: record every frame Dynamo compiles while the caller's calls run, with its guards.

Built on Dynamo's own machinery: a CompilePackage records the entry, its graph-break continuations
and each guarded recompilation; PrecompileContext holds the compiled backends; our guard filter
records every guard's verdict (the summary's kept and dropped slots) as Dynamo asks for it.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import pickle
import sys
import threading
import types
from pathlib import Path
from typing import Any, Callable

import torch

from precompile.artifact.envelope import FORMAT_VERSION, Backend
from precompile.artifact.metadata import CompiledSubgraph, DynamoFrame, DynamoMetadata, InlinedSource, VariantGuards
from precompile.artifact.pycode import cyclic_gc_paused
from precompile.artifact.summary import PrecompileSummary, without_object_ids
from precompile.capturing import kernels, pipeline
from precompile.capturing.dynamo.call_built_state import CallBuiltState, traced_sources
from precompile.capturing.dynamo.guard_accounting import GuardLedger, SlotLists, account_frame, wont_generalize
from precompile.capturing.dynamo.guard_pickling import (
    faithful_guard_pickling,
    pin_read_back_values,
    refuse_unfaithful_guard_state,
)
from precompile.capturing.dynamo.key_lookups import KeyLookups, apply, key_lookups, recorded_misses
from precompile.capturing.dynamo.logs import BackendFallbackLog, GraphBreakReasons, TruncationLog
from precompile.capturing.dynamo.minted_globals import record_guarded_minted_modules, record_minted_modules
from precompile.capturing.dynamo.next_call import CallMode, served_again
from precompile.capturing.dynamo.parametrized import refuse_parametrized_modules
from precompile.capturing.dynamo.set_order import warn_set_order
from precompile.capturing.dynamo.standalone import minted_renamed, readable_guards, remainder_bytes, standalone_parts
from precompile.capturing.dynamo.subgraphs import AtenRecorder, InductorLowerer, split_sources
from precompile.capturing.inlined_files import identified_sources, inlined_files
from precompile.capturing.lowering import lower_eager
from precompile.capturing.progress import libraries_in, phase
from precompile.capturing.tracers import DynamoTracer
from precompile.codegen.models import SubgraphSection
from precompile.codegen.render import render_dynamo, render_dynamo_standalone
from precompile.errors import CaptureRefused, PrecompileError
from precompile.serve import ranks as distributed

log = logging.getLogger("precompile")
_active = threading.Lock()

def serves_installed(entry, frames: list[DynamoFrame]) -> bool:
    """Frames reached by an ordinary call serve only through Dynamo's frame evaluator; so does a
    capture whose code a standalone artifact cannot marshal (`unmarshallable_constant`)."""
    return (any(frame.installed and (frame.variants or frame.bypassed) for frame in frames)
            or unmarshallable_constant(entry) is not None)


def unmarshallable_constant(entry) -> str | None:
    """A constant of the captured code (each frame's original and transformed code, nested code
    included) that marshal cannot write, as its repr; None where there is none. Dynamo bakes one into
    the code that re-enters a `with torch.autocast(device, dtype=torch.bfloat16):` block after a graph
    break (the dtype): a standalone artifact ships code marshalled, an installed one pickled."""
    import marshal

    from precompile.torch_compat import SerializedCode

    pending = [SerializedCode.to_code_object(code.python_code) for code in entry.codes]
    pending += [SerializedCode.to_code_object(g.dynamo_code) for code in entry.codes for g in code.guarded_codes]
    while pending:
        for const in pending.pop().co_consts:
            if isinstance(const, types.CodeType):
                pending.append(const)
                continue
            try:
                marshal.dumps(const)
            except ValueError:
                return repr(const)
    return None


def refuse_unsupported_fn(fn: Callable[..., Any]) -> None:
    """A Dynamo artifact rebuilds fn from its code object: fn must be a module-level function."""
    if isinstance(fn, torch.nn.Module):
        raise CaptureRefused(
            "DynamoTracer captures a function that CALLS the model, not the model itself; pass e.g. "
            "`def step(model, x): return model(x)` defined at module level, and the model as an argument"
        )
    if not isinstance(fn, types.FunctionType):
        raise CaptureRefused(f"DynamoTracer captures a Python function, got {type(fn).__name__}; pass a module-level def")
    if fn.__name__ == "<lambda>":
        raise CaptureRefused("DynamoTracer cannot capture a lambda; define fn with def at module level (MakeFxTracer takes lambdas)")
    if fn.__closure__:
        raise CaptureRefused(
            f"DynamoTracer cannot capture {fn.__qualname__}: it closes over {list(fn.__code__.co_freevars)}; "
            "define it at module level and pass what it closes over as arguments"
        )
    if "<locals>" in fn.__qualname__:
        raise CaptureRefused(f"DynamoTracer cannot capture {fn.__qualname__}, a nested function; define it at module level")
    if fn.__module__ == "__main__":
        raise CaptureRefused(
            f"DynamoTracer cannot capture {fn.__qualname__}: it is defined in __main__, which a serving process cannot "
            "import; move it into an importable module"
        )


def runs_as_python(code, continuations: set) -> bool:
    """Whether a non-entry package frame is served by its original bytecode with nothing compiled given
    up: it compiled no graph and calls no further continuation. That is a graph-break continuation
    with plain Python after the break, a function the captured code calls that has nothing for Dynamo
    to compile (a generated dataclass __init__, say), or one Dynamo gave up on (it ran eagerly in the
    capture too, with the frames it calls intercepted on their own)."""
    if code.backend_ids or code.bypassed:
        return False
    return not any(continuations & set(guarded.dynamo_code.co_names) for guarded in code.guarded_codes)


def refuse_uninstallable(entry, frames: list[DynamoFrame]) -> None:
    """An installed artifact finds each frame reached by an ordinary call again by its module and
    qualified name in the serving process: refuse, at write time, one that cannot be found that way."""
    from precompile.torch_compat import SerializedCode
    from precompile.torch_compat import lookup_code as _lookup_code

    lost = []
    for code, frame in ((c, f) for c, f in zip(entry.codes, frames) if f.installed):
        if code.python_module == "__main__":
            lost.append(f"{frame.qualname} (defined in __main__, which a serving process cannot import)")
            continue
        try:
            found = _lookup_code(code)
        except Exception:  # any failure to resolve is the refusal below
            found = None
        if found != SerializedCode.to_code_object(code.python_code):
            lost.append(f"{frame.qualname} ({frame.module}, line {frame.first_line}: not reachable by that name)")
    if lost:
        raise CaptureRefused(
            f"the capture compiled frames the entry reaches by an ordinary call, which an installed artifact "
            f"must find again by module and qualified name, and these cannot be: {lost}; define those "
            "functions and classes at module level of an importable module"
        )


def _uncovered_frames(entry, frames: list[DynamoFrame]) -> tuple[str, ...]:
    """Frames that compiled but left no variant: neither bypassed nor served as plain Python."""
    return tuple(
        code.python_code.co_name
        for code, frame in zip(entry.codes, frames)
        if code.has_compile_id and not code.guarded_codes and not code.bypassed and not frame.runs_as_python
    )


def _raised_building_guards(exc: BaseException) -> bool:
    """Whether `exc` came from inside torch while Dynamo built a frame's guards (the traceback runs
    through torch._dynamo.guards and ends in torch's code), where none of fn's own code runs."""
    modules = []
    frame = exc.__traceback__
    while frame is not None:
        modules.append(frame.tb_frame.f_globals.get("__name__", ""))
        frame = frame.tb_next
    return "torch._dynamo.guards" in modules and modules[-1].startswith("torch.")


class DynamoSession:
    """One DynamoTracer capture: calls run compiled and are recorded; `build()` renders the pair."""

    def __init__(self, fn, tracer: DynamoTracer, backend: Backend, artifact_path: Path) -> None:
        # capture() has refused, up front, the functions and backends this session cannot take.
        self.fn = fn
        self.tracer = tracer
        self.backend = backend
        self.artifact_path = artifact_path
        self.calls = 0
        self.errors: list[str] = []
        self._stack = contextlib.ExitStack()
        self._ledger = GuardLedger(tracer.guard_filter_fn)
        self._truncation = TruncationLog()
        self._fallbacks = BackendFallbackLog()
        self.kernel_build: kernels.KernelBuild | None = None
        self._served_calls: list[tuple[tuple, dict, CallMode]] = []
        """Each call that ran, to check at build whether the artifact would serve it again."""
        self._warned: set[int] = set()
        self._call_built: CallBuiltState | None = None

    def __enter__(self) -> DynamoSession:
        if not _active.acquire(blocking=False):
            raise CaptureRefused("another DynamoTracer capture is active in this process; do not overlap them")
        self._stack.callback(_active.release)
        try:
            self._start()
        except BaseException:
            self._stack.close()  # a session that failed to start holds nothing: the lock, the cache dir
            raise
        return self

    def _start(self) -> None:
        from precompile.torch_compat import CompilePackage, PrecompileContext, dynamo, dynamo_config, functorch_config

        if self.backend == "inductor":  # the eager backend builds no kernels
            self.kernel_build = self._stack.enter_context(kernels.private_inductor_cache())
        # Dynamo skips its guards on module hooks by default (a hook added after compiling is silently
        # not run); the artifact checks them, so a hook registered after capture is a CallMismatch.
        self._stack.enter_context(dynamo_config.patch(recompile_limit=self.tracer.recompile_limit,
                                                      skip_nnmodule_hook_guards=False))
        # Guard state is pickled as each frame compiles: a module whose class pickles itself is written so, and
        # a function torch 2.15 would write by its code object as a placeholder.
        self._unpicklable = self._stack.enter_context(faithful_guard_pickling())
        self._misses = self._stack.enter_context(recorded_misses())
        dynamo_log = logging.getLogger("torch._dynamo.convert_frame")
        dynamo_log.addHandler(self._truncation)
        self._stack.callback(dynamo_log.removeHandler, self._truncation)
        graph_break_log = logging.getLogger("torch._dynamo.exc")
        graph_break_log.addHandler(self._fallbacks)
        self._stack.callback(graph_break_log.removeHandler, self._fallbacks)
        self._stack.enter_context(
            functorch_config.patch(force_non_lazy_backward_lowering=True, bundled_autograd_cache=True)
        )
        # Compiled code a previous compile left on fn (or on its continuations) would serve calls
        # without compiling, so nothing would be recorded: start from Dynamo's empty caches.
        dynamo.reset()
        PrecompileContext.clear()
        self._graph_breaks = GraphBreakReasons()
        self.package = CompilePackage(self.fn)
        self._recorder = AtenRecorder() if self.kernel_build is None else InductorLowerer(self.kernel_build.directory)
        self.compiled = dynamo.optimize(
            backend=self._recorder, package=self.package, guard_filter_fn=self._ledger,
            dynamic=self.tracer.dynamic,
        )(self.fn)

    def __exit__(self, *exc_info) -> None:
        self._stack.close()

    def __call__(self, *args, **kwargs):
        refuse_parametrized_modules(args, kwargs)
        if self._call_built is None:
            self._call_built = CallBuiltState(self.fn, args, kwargs)
        self.calls += 1
        try:
            counted = libraries_in(self.kernel_build.directory) if self.kernel_build is not None else None
            with self._kernel_dir_held(), phase(f"call {self.calls}: compile what Dynamo has not yet, and run", counted):
                result = self.compiled(*args, **kwargs)
            self._served_calls.append((args, kwargs, CallMode.now()))
            return result
        except Exception as exc:
            # A refusal of ours from inside the backend reaches the caller as itself, not wrapped in
            # Dynamo's BackendCompilerFailed; so does one from guard pickling (Dynamo rewraps it as an
            # InternalTorchDynamoError whose __context__ it is).
            refusal = getattr(exc, "inner_exception", None) or exc.__context__
            shown = refusal if isinstance(refusal, PrecompileError) else exc
            message = f"{type(shown).__name__}: {shown}"
            if message not in self.errors:
                self.errors.append(message)
            if shown is not exc:
                raise shown from None
            from precompile.torch_compat import PackageError

            if isinstance(exc, PackageError):
                raise CaptureRefused(
                    f"the call compiled a frame the artifact cannot record ({exc}): every compiled frame must be "
                    "found again by module and qualified name; define the functions and classes the call reaches "
                    "in an importable module (not __main__, not exec'd code), or capture with MakeFxTracer"
                    + ("; torch 2.11 cannot find one a library made inside another function (transformers' "
                       "gradient-checkpointing layers), torch 2.12 and later can" if torch.__version__.startswith("2.11.") else "")
                ) from exc
            if _raised_building_guards(exc):
                raise CaptureRefused(
                    f"torch {torch.__version__} failed inside Dynamo's own guard building for a frame of the call "
                    f"({type(exc).__name__}: {str(exc).strip()}); that is torch's failure, not fn's. Capture with "
                    "tracer=precompile.MakeFxTracer(), or with another torch (docs/torch-versions.md names what each refuses)"
                ) from exc
            raise

    # -- rendering -------------------------------------------------------------------------------
    def summary(self) -> PrecompileSummary:
        entry, frames, guards, backends, slots, _, _ = self._collect()
        return self._summary(entry, frames, backends, guards, slots)

    def _collect(self):
        entry = self.package.cache_entry()
        backends, frames, guards = {}, [], []
        slots = SlotLists()
        taken: set = set()
        states: dict = {}
        continuations = {name for code in entry.codes if code.install_to_global for name in code.function_names}
        for index, code in enumerate(entry.codes):
            record_minted_modules(code)
            where = self._where(index, code)
            if index and runs_as_python(code, continuations):
                # Nothing compiled here and nothing after it: served by its original bytecode, and its
                # guards (which would only make calls miss) are left out of the artifact and the summary.
                frames.append(DynamoFrame(
                    name=code.python_code.co_name, module=code.python_module, variants=0,
                    resume_names=tuple(code.function_names) if code.install_to_global else (),
                    runs_as_python=True, **where,
                ))
                continue
            for backend_id in code.backend_ids:
                compiled = self._recorder.recorded(self.package.cached_backends.get(backend_id))
                if compiled is None:
                    code.bypassed = True
                else:
                    backends[backend_id] = (where["qualname"], compiled)
            frames.append(
                DynamoFrame(
                    name=code.python_code.co_name, module=code.python_module, variants=len(code.guarded_codes),
                    resume_names=tuple(code.function_names) if code.install_to_global else (), bypassed=code.bypassed,
                    **where,
                )
            )
            guards += account_frame(code, where["qualname"], self._ledger, slots, taken, states)
        lookups = KeyLookups()
        installed = serves_installed(entry, frames)
        if not installed:  # an installed artifact is checked by Dynamo's own guards
            lookups = key_lookups(entry, states, self._ledger.seen, slots.dropped, self._misses)
            guards = apply(lookups, guards, slots, self._ledger.rendered)
        return entry, frames, guards, backends, slots, lookups, installed

    def _where(self, index: int, code) -> dict:
        """Where a frame's code lives: the entry is fn; a continuation is reached by the global names
        Dynamo minted for it; any other frame is reached by an ordinary call, so an installed
        artifact finds its live code object again by qualified name."""
        if index == 0:
            qualname = self.fn.__qualname__
        elif code.install_to_global:
            qualname = code.python_code.co_name
        else:  # where Python says it is defined, e.g. Block.forward or deco.<locals>.wrapper
            qualname = getattr(code.python_code, "co_qualname", None) or code.python_code.co_name
        installed = bool(index) and not code.install_to_global
        return {"qualname": qualname, "first_line": code.python_code.co_firstlineno, "installed": installed}

    def build(self) -> pipeline.Pair:
        for call, (args, kwargs, mode) in enumerate(self._served_calls, 1):
            with mode.entered():
                again = call in self._warned or served_again(self.fn, args, kwargs, call)
            if not again:
                self._warned.add(call)
        # Rendering builds hundreds of thousands of short-lived objects (syntax trees of every guard,
        # the text): with the collector paused they are freed by refcounting alone, where they would
        # set off full collections over all of torch's objects (see cyclic_gc_paused).
        with self._kernel_dir_held(), phase("render the Dynamo artifact"), cyclic_gc_paused():
            return self._build()

    def _kernel_dir_held(self) -> contextlib.AbstractContextManager:
        """The kernel dir held for a call or the build (Inductor compiles into it, the freeze reads it);
        the caller's code between calls holds nothing (kernel_dir.py)."""
        return self.kernel_build.held() if self.kernel_build is not None else contextlib.nullcontext()

    def _build(self) -> pipeline.Pair:
        entry, frames, guards, backends, slots, lookups, installed = self._collect()
        summary = self._summary(entry, frames, backends, guards, slots)
        self._gate(summary)
        self._refuse_state_built_before(entry, guards)
        if installed:
            refuse_uninstallable(entry, frames)
            record_guarded_minted_modules(entry, frames, guards)
            refuse_unfaithful_guard_state(entry, frames, guards, self._ledger.seen)
            guards = pin_read_back_values(entry, frames, guards, self._ledger.seen)
            guards = readable_guards(entry, frames, guards, self._ledger.seen)
        sections, subgraphs, pickled_backends, modules = self._subgraphs(backends)
        inlined = identified_sources(
            InlinedSource(module=s.module, first_line=s.firstlineno, last_line=s.lastlineno, sha256=s.checksum)
            for s in sorted(entry.source_info.inlined_sources, key=lambda s: (s.module, s.firstlineno, s.lastlineno))
        )
        metadata = DynamoMetadata(
            format_version=FORMAT_VERSION,
            backend=self.backend,
            serving_mode="installed" if installed else "standalone",
            torch_version=str(torch.__version__),
            python_version=(sys.version_info.major, sys.version_info.minor),
            fn_name=pipeline.qualified_name(self.fn),
            fn_module=self.fn.__module__,
            frames=tuple(frames),
            guards=tuple(guards),
            summary=summary,
            inlined_sources=inlined,
            inlined_files=inlined_files(inlined),
            subgraphs=tuple(subgraphs),
            world=distributed.captured_world([*(section.source for section in sections), *modules]),
        )
        if installed:  # served through Dynamo's frame evaluator: the package entry travels pickled
            state = pickle.dumps(
                {"codes": entry.codes, "backends": pickled_backends, "defaults": self.fn.__defaults__,
                 "kwdefaults": self.fn.__kwdefaults__}
            )
            source = render_dynamo(
                metadata, sections, base64.b64encode(state).decode("ascii"), hashlib.sha256(state).hexdigest(), len(state)
            )
        else:
            parts = standalone_parts(entry, frames, guards, self.fn, pickled_backends,
                                     [section.source for section in sections], self._ledger.seen, lookups)
            source = minted_renamed(render_dynamo_standalone(metadata, sections, parts, remainder_bytes(parts)), parts)
        warn_set_order(source)
        log.info("rendered a Dynamo artifact: %d frames, %d variants", len(frames), len(guards))
        return pipeline.finish(source, backend=self.backend, tracer="dynamo", kernel_build=self.kernel_build,
                               kernel_modules=modules)

    def _subgraphs(self, backends: dict) -> tuple[list[SubgraphSection], list[CompiledSubgraph], dict, list[str]]:
        """Each compiled graph's lowered source as a python_code section, what stays opaque, and the
        Inductor output modules' text (where the kernel bundle finds their kernels)."""
        sections, subgraphs, pickled, modules = [], [], {}, []
        for index, (backend_id, (frame, compiled)) in enumerate(backends.items()):
            name = f"graph_{index}"
            where = f"{name}, compiled in frame {frame!r}"
            if isinstance(self._recorder, AtenRecorder):
                source = lower_eager(compiled.aten, entry=name).source
                sections.append(SubgraphSection(
                    title=f"{where}: ATen ops, run as they are (autograd flows through them)",
                    slug=name.replace("_", "-"), name=name, source=source, runs_in_place=True,
                ))
                subgraphs.append(CompiledSubgraph(backend_id=backend_id, frame=frame, forward=name, served_by="aten"))
                continue
            if compiled.aot is None:
                sections.append(compiled.section(name, where))
                modules += compiled.texts.values()
                subgraphs.append(CompiledSubgraph(
                    backend_id=backend_id, frame=frame, forward=f"{name}_forward",
                    backward=f"{name}_backward" if compiled.plan else "", served_by="inductor_runtime",
                ))
                continue
            stripped, sources = split_sources(compiled.aot)
            pickled[backend_id] = stripped
            names = {part: f"{name}_{part}" for part in sources}
            for part, text in sources.items():
                sections.append(SubgraphSection(
                    title=f"{where}: {part} output module, served by AOTAutograd because of "
                          f"{compiled.reason}; loaded as written here",
                    slug=names[part].replace("_", "-"), name=names[part], source="\n" + text.strip("\n") + "\n", runs_in_place=False,
                ))
                modules.append(text)
            subgraphs.append(CompiledSubgraph(
                backend_id=backend_id, frame=frame, forward=names["forward"], backward=names.get("backward", ""),
                served_by="aotautograd", fallback_reason=compiled.reason,
            ))
        return sections, subgraphs, pickled, modules

    def _summary(self, entry, frames: list[DynamoFrame], backends: dict, guards: list[VariantGuards], slots: SlotLists) -> PrecompileSummary:
        return PrecompileSummary(
            frames=len(frames),
            resume_functions=sum(1 for f in frames if f.resume_names),
            guarded_codes=sum(f.variants for f in frames),
            backend_graphs=len(backends),
            bypassed=tuple(f.name for f in frames if f.bypassed),
            truncated=tuple(self._truncation.frames),
            uncovered_frames=_uncovered_frames(entry, frames),
            dropped_guards=tuple(sorted(slots.dropped)),
            kept_guards=tuple(sorted(slots.kept)),
            risky_dropped_guards=tuple(sorted((self._ledger.configured | slots.told_apart) & slots.dropped)),
            policy_dropped_guards=tuple(sorted(slots.policy)),
            dropped_guard_code=self._dropped_guard_code(slots),
            wont_generalize=wont_generalize(guards),
            capture_errors=tuple(dict.fromkeys((*self.errors, *self._fallbacks.errors))),
        )

    def _dropped_guard_code(self, slots: SlotLists) -> tuple[tuple[str, str, str], ...]:
        """(type, source, check) of each dropped slot whose check was rendered, the filter's first."""
        rendered = {slot: check for slot, check in self._ledger.rendered.items() if slot in slots.dropped}
        for slot, check in slots.policy_code.items():
            rendered.setdefault(slot, check)
        return tuple((t, src, without_object_ids(check)) for (t, src), check in sorted(rendered.items()))

    def _refuse_state_built_before(self, entry, guards: list[VariantGuards]) -> None:
        """A model run before the capture is captured in the state its calls built; a fresh serving
        model misses (call_built_state.py). A coverage gap: require_complete=False writes it anyway."""
        if self._call_built is None or not self.tracer.require_complete:
            return
        built = self._call_built.built_before(traced_sources(entry), guards)
        if built:
            raise CaptureRefused(
                f"the model came to the capture with state its own calls build, which the artifact's guards "
                f"check: {built}; no call of the capture changed it, so a call before the capture built it, and "
                "a fresh serving model, which has not run yet, misses. Capture from a model that has not been "
                "called (its first call inside the capture builds that state; call it twice so that the calls "
                "after the first are recorded too), or pass DynamoTracer(require_complete=False) and run the "
                "serving model once, eagerly, before its first served call"
            )

    def _gate(self, summary: PrecompileSummary) -> None:
        # A frame past recompile_limit ran eager and is only reported (truncated): the limit is the
        # caller's choice. A bypassed or uncovered frame, a call that raised or nothing compiled is a gap.
        gap = summary.bypassed or summary.uncovered_frames or summary.capture_errors or not (
            summary.guarded_codes and summary.backend_graphs
        )
        if self.tracer.require_complete and gap:
            if self._unpicklable:  # a frame torch bypassed: its guards did not pickle
                raise self._unpicklable[0]
            reasons = self._graph_breaks.since()
            why = f"; Dynamo broke graphs or skipped frames because: {reasons}" if reasons else ""
            raise CaptureRefused(
                f"the capture is incomplete ({summary}){why}; run calls that compile every frame, follow "
                "Dynamo's hint, capture with MakeFxTracer, or pass DynamoTracer(require_complete=False) to "
                "write a partial artifact"
            )
        if self.tracer.require_no_risky_drops and summary.risky_dropped_guards:
            raise CaptureRefused(
                f"the capture dropped guards that matter ({summary}); keep them in guard_filter_fn, or pass "
                "DynamoTracer(require_no_risky_drops=False)"
            )

