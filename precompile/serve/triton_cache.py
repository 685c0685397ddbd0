"""Triton inside a capture block, and a serving process primed for it.

Inside a block, Triton compiles into the block's own cache dir with its autotuning cache on, and
the in-memory caches of every JIT kernel (JITFunction.device_caches) and autotuner
(Autotuner.cache) are set aside, so whatever the serving process needs is compiled and tuned again
there, where it lands in the bundle. When the block closes they are restored, with what the block
produced laid over them. A write checks that every kernel and autotune decision the block made is
in that dir (`unfrozen`); load points Triton at the primed copy (`serve_from`).

Nothing here imports triton: a Triton that is not imported yet has no in-memory cache to set
aside, and reads the environment variables set here when it is imported.
"""
from __future__ import annotations

import collections
import contextlib
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from precompile.serve import environment

CACHE_DIR_VAR = "TRITON_CACHE_DIR"
AUTOTUNE_CACHE_VAR = "TRITON_CACHE_AUTOTUNING"
_UNSET = object()
# The tuning log of each open block, by its directory (captures in a process take turns).
_open_blocks: dict[str, TuningLog] = {}


@contextlib.contextmanager
def triton_block(directory: Path) -> Iterator[None]:
    """Triton compiles into `directory` and tunes afresh there until the block closes."""
    log = _open_blocks[str(directory)] = TuningLog()
    try:
        with _environment({CACHE_DIR_VAR: str(directory), AUTOTUNE_CACHE_VAR: "1"}), _knobs(
            cache={"dir": str(directory)}, autotuning={"cache": True, "listener": log.listener()}
        ), _autotuners_caching(), _memory_caches_set_aside():
            pick_ptxas_as_inductor_does()
            yield
    finally:
        del _open_blocks[str(directory)]


class TuningLog:
    """The autotune decisions taken inside a block: (kernel name, tuning key, config has a pre_hook)."""

    def __init__(self) -> None:
        self.decisions: set[tuple[str, str, bool]] = set()

    def listener(self):
        earlier = _knob("autotuning", "listener")
        earlier = None if earlier is _UNSET else earlier

        def record(*, fn, key, best_config, configs_timings, **more):
            hooked = any(getattr(config, "pre_hook", None) for config in configs_timings or (best_config,))
            self.decisions.add((fn.__name__, repr(key), hooked))
            if earlier is not None:
                earlier(fn=fn, key=key, best_config=best_config, configs_timings=configs_timings, **more)

        return record


def unfrozen(directory: Path) -> list[str]:
    """What the open block on `directory` compiled or tuned that is not in it, one line per kernel; [] when all is.

    A JIT kernel specialization in a kernel's live in-memory cache was compiled in the block (the
    earlier ones were set aside); every file Triton recorded for it must be in `directory`. Each
    autotune decision the block benchmarked without a pre_hook must have left its `.autotune.json`
    there (Triton does not cache decisions over pre_hook configs: those re-tune at serve time).
    """
    root = os.path.realpath(directory)
    problems = []
    for fn in _instances("triton.runtime.jit", "JITFunction"):
        for entry in getattr(fn, "device_caches", {}).values():
            kernels = entry[0] if isinstance(entry, tuple) and entry and isinstance(entry[0], dict) else {}
            for kernel in kernels.values():
                outside = sorted(
                    path for path in (getattr(kernel, "metadata_group", None) or {}).values()
                    if not (os.path.realpath(path).startswith(root + os.sep) and os.path.isfile(path))
                )
                if outside or not hasattr(kernel, "metadata_group"):
                    where = f"its files {outside[:2]} lie outside the block's Triton cache dir" if outside else (
                        "it is still compiling or was not compiled by Triton's file cache")
                    problems.append(f"Triton kernel {_name(fn)}: {where}")
    log = _open_blocks.get(str(directory), TuningLog())
    wanted = collections.Counter(name[:150] for name, _, hooked in log.decisions if not hooked)
    written = collections.Counter(path.name.removesuffix(".autotune.json") for path in Path(directory).rglob("*.autotune.json"))
    for name, count in sorted(wanted.items()):
        if written[name] < count:
            problems.append(
                f"Triton autotuner of {name}: the block took {count} tuning decisions but Triton's autotuning "
                f"cache holds {written[name]} (was TRITON_CACHE_AUTOTUNING or a custom cache manager overridden?)"
            )
    return sorted(set(problems))


def serving_dir(cache_dir: Path) -> Path:
    """Where this process's Triton reads its cache: the dir the program or the environment set, else
    the one beside Inductor's `cache_dir` that Inductor itself would use."""
    owner = _knob_group("cache")
    configured = vars(owner).get("dir") if owner is not None else None
    return Path(configured or os.environ.get(CACHE_DIR_VAR) or cache_dir / "triton" / "0")


def serve_from(directory: Path) -> None:
    """Point this process's Triton at the primed `directory`, with its autotuning cache on.

    Triton compiles (and finds its kernels) whenever a kernel is first launched, long after load
    returns: so Triton's own in-process settings (triton.knobs, Triton imported here if it is not
    yet) point there for the rest of the process. The environment variables are set too, for
    Inductor's code that reads them while python_code builds its kernels; load puts them back once it
    returns (serve/environment.py), so no child process inherits them. A TRITON_CACHE_DIR the user
    set, or a cache dir the program gave Triton, is where priming put the files, so it stays;
    autotuners that exist already start consulting the cache too.
    """
    with contextlib.suppress(ImportError):
        import triton  # noqa: F401  (its settings must outlive load; a Triton that cannot import launches nothing)
    pick_ptxas_as_inductor_does()
    owner = _knob_group("cache")
    if not os.environ.get(CACHE_DIR_VAR) and not (owner is not None and vars(owner).get("dir")):
        os.environ[CACHE_DIR_VAR] = str(directory)
        _set_knob("cache", "dir", str(directory))
    os.environ[AUTOTUNE_CACHE_VAR] = "1"
    _set_knob("autotuning", "cache", True)
    for autotuner in _instances("triton.runtime.autotuner", "Autotuner"):
        autotuner.cache_results = True


def pick_ptxas_as_inductor_does() -> None:
    """Point Triton at the ptxas Inductor compiles with (TRITON_PTXAS_PATH, unless set: torch's own),
    as Inductor does before it first compiles (and leaves for the process), and have Triton read its
    version again. Triton keys every compiled kernel by that version, read once per process: a process
    that compiled a kernel before Inductor set the variable (a user kernel, tuned before the capture
    block) keyed the block's kernels by Triton's bundled ptxas, and a serving process, where Inductor
    sets it first, missed them all (the first GPU check). Inductor's function runs once per process
    (torch 2.11 caches it), so it is called past its cache."""
    from precompile.torch_compat import set_triton_ptxas_path

    getattr(set_triton_ptxas_path, "__wrapped__", set_triton_ptxas_path)()
    nvidia = sys.modules.get("triton.backends.nvidia.compiler")
    forget = getattr(getattr(nvidia, "get_ptxas_version", None), "cache_clear", None)
    if forget is not None:
        forget()


# -- the pieces of a block ------------------------------------------------------------------------


def _name(fn) -> str:
    inner = getattr(fn, "fn", fn)
    return f"{getattr(inner, '__module__', '?')}.{getattr(inner, '__qualname__', repr(inner))}"


def _instances(module: str, class_name: str) -> list:
    """Every live instance of a Triton class, if Triton is imported (a gc walk: at block edges only)."""
    kind = getattr(sys.modules.get(module), class_name, None)
    if kind is None:
        return []
    return [obj for obj in gc.get_objects() if issubclass(type(obj), kind)]  # type(): no proxy's __class__


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    with environment.restored(tuple(values)):
        os.environ.update(values)
        yield


def _knob_group(group: str):
    knobs = getattr(sys.modules.get("triton"), "knobs", None)
    return getattr(knobs, group, None)


def _knob(group: str, name: str):
    owner = _knob_group(group)
    return getattr(owner, name, _UNSET) if owner is not None else _UNSET


def _set_knob(group: str, name: str, value) -> None:
    owner = _knob_group(group)
    if owner is not None and _is_knob(owner, name):
        vars(owner)[name] = value  # bypass the descriptor: it would also export an environment variable


def _is_knob(owner, name: str) -> bool:
    """Whether `name` is one of the settings of Triton's knob group `owner`: a descriptor of its class
    (looked up in the classes' dicts: Triton's descriptors cannot be read from the class, so hasattr
    on it is always false, and the knobs were never set: found by a hostile review)."""
    return any(name in vars(klass) for klass in type(owner).__mro__)


@contextlib.contextmanager
def _knobs(**groups: dict) -> Iterator[None]:
    """Set triton.knobs values for the block (if Triton is imported) and put the program's back after."""
    saved = []
    for group, values in groups.items():
        owner = _knob_group(group)
        if owner is None:
            continue
        for name, value in values.items():
            if _is_knob(owner, name) or name in vars(owner):
                saved.append((owner, name, vars(owner).get(name, _UNSET)))
                vars(owner)[name] = value
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is _UNSET:
                vars(owner).pop(name, None)
            else:
                vars(owner)[name] = value


@contextlib.contextmanager
def _autotuners_caching() -> Iterator[None]:
    """Autotuners decorated before the block read the autotuning-cache knob then: turn theirs on too."""
    saved = [(autotuner, autotuner.cache_results) for autotuner in _instances("triton.runtime.autotuner", "Autotuner")]
    for autotuner, _ in saved:
        autotuner.cache_results = True
    try:
        yield
    finally:
        for autotuner, value in saved:
            autotuner.cache_results = value


@contextlib.contextmanager
def _memory_caches_set_aside() -> Iterator[None]:
    """Empty the JIT kernel and autotuner caches for the block; afterwards, the block's entries over the old."""
    functions = [fn for fn in _instances("triton.runtime.jit", "JITFunction") if hasattr(fn, "device_caches")]
    autotuners = _instances("triton.runtime.autotuner", "Autotuner")
    kept_kernels = [(fn, fn.device_caches) for fn in functions]
    kept_decisions = [(autotuner, autotuner.cache) for autotuner in autotuners]
    for fn in functions:
        fn.device_caches = collections.defaultdict(fn.create_binder)
    for autotuner in autotuners:
        autotuner.cache = {}
    try:
        yield
    finally:
        for fn, earlier in kept_kernels:
            fn.device_caches = _merged_device_caches(earlier, fn.device_caches)
        for autotuner, earlier in kept_decisions:
            autotuner.cache = {**earlier, **autotuner.cache}


def _merged_device_caches(earlier, block):
    """Per device, the block's compiled specializations laid over the earlier ones.

    Each device's entry is a tuple whose dicts are caches (kernels by specialization key, and the
    memo of how keys are computed); the rest (target, backend, binder) is the same either way.
    """
    for device, entry in block.items():
        before = earlier.get(device)
        if before is None:
            earlier[device] = entry
            continue
        for mine, theirs in zip(before, entry):
            if isinstance(mine, dict) and isinstance(theirs, dict):
                mine.update(theirs)
    return earlier
