"""Freezing kernels at capture: compile into a private cache dir, then collect what the serving process
needs into the cache's bundle, with the requirements (bundle_keys) it depends on. The serving side,
priming a process from the bundle, is serve/kernels.py.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import os
import sysconfig
import tempfile
import threading
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from precompile.artifact import bundle_keys, triton_groups
from precompile.artifact.bundle_rules import kind_of
from precompile.capturing.kernel_dir import KernelDir
from precompile.errors import CaptureRefused, PrecompileWarning
from precompile.serve import triton_cache
from precompile.serve.kernels import built_from, gpu_keys


def collect_files(cache_dir: Path) -> dict[str, tuple[str, bytes]]:
    """The kernel files in a private cache dir, {relative path: (kind, bytes)}.

    Raises PrecompileError naming each Triton kernel or autotune decision of the capture's block
    that is not among them (so it could not be frozen).
    """
    missing = triton_cache.unfrozen(cache_dir / _TRITON_DIR)
    if missing:
        raise CaptureRefused(
            "could not freeze the Triton kernels the serving process needs: " + "; ".join(missing)
            + ". Let Triton compile them inside the capture block with its default file cache manager"
        )
    return _kernel_files(cache_dir)


def _kernel_files(cache_dir: Path) -> dict[str, tuple[str, bytes]]:
    files = {}
    for path in sorted(cache_dir.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(cache_dir).as_posix()
        kind = kind_of(relative)
        if kind is None:
            continue
        data = path.read_bytes()
        if triton_groups.is_group(relative):
            try:
                data = triton_groups.portable(data, relative)
            except ValueError as exc:
                raise CaptureRefused(f"could not freeze the Triton kernels the serving process needs: {exc}") from None
        files[relative] = (kind, data)
    return files


def kernel_texts(source: str) -> dict[str, str]:
    """{kernel name: its C++ source} for every `name = async_compile.cpp_pybinding(types, src)`."""
    found = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "cpp_pybinding"
            and len(call.args) == 2
            and isinstance(call.args[1], ast.Constant)
            and isinstance(call.args[1].value, str)
        ):
            found[node.targets[0].id] = call.args[1].value
    return found


def kernels_by_source(modules: Iterable[str]) -> dict[str, tuple[str, str]]:
    """{sha256 of a kernel's C++ source: (its name, the source)} for every kernel of the Inductor
    output `modules` (their texts)."""
    return {hashlib.sha256(text.encode("utf-8")).hexdigest(): (name, text)
            for module in modules for name, text in kernel_texts(module).items()}


def libraries_by_source(sources: dict[str, str], files: dict[str, tuple[str, bytes]]) -> dict[str, str]:
    """{sha256 of a kernel's C++ source: its library's path in `files`} for the kernels `sources`
    ({sha256: C++ source}, from the Inductor output modules), matched by content (see `built_from`)."""
    built = {
        path[: -len(".cpp")] + ".so": data.decode("utf-8", "replace")
        for path, (kind, data) in files.items()
        if kind == "kernel-source" and path[: -len(".cpp")] + ".so" in files
    }
    return _matched(sources, built)


def built_so_far(directory: Path, modules: Iterable[str], read: dict[str, str]) -> dict[str, str]:
    """{sha256 of a kernel's C++ source: the absolute path of its library} for the kernels of the
    Inductor output `modules` that the build in `directory` has compiled so far. The capture runs its
    rendered code on these, as load runs python_code on a primed bundle, rather than asking Inductor
    again: Inductor's own lookup keys a kernel on its build command, which differs between lowering
    (precompiled headers on) and the served driver's fallback (off), so it would compile them twice.
    `read` ({library: the C++ file it was built from}) holds what earlier calls read; this call adds to it."""
    sources = {digest: text for digest, (_, text) in kernels_by_source(modules).items()}
    if not sources:
        return {}
    for path in directory.rglob("*.cpp"):
        library = path.with_suffix(".so")
        if str(library) not in read and kind_of(path.relative_to(directory).as_posix()) == "kernel-source" and library.is_file():
            read[str(library)] = path.read_text("utf-8", "replace")
    return _matched(sources, read)


def _matched(sources: dict[str, str], built: dict[str, str]) -> dict[str, str]:
    found = {}
    for digest, text in sources.items():
        library = built_from(text, built)
        if library is not None:
            found[digest] = library
    return found


PRECOMPILED_HEADERS = True
"""Kernels compile with precompiled headers, as torch.compile's do by default: each C++ build then
reads torch's headers precompiled instead of parsing them (about 40% of a build on a 2-core host).
Inductor keeps the precompiled header in its own per-user dir, outside the capture's, so a host
builds it once per compiler and flags. It changes how kernels build, not what they do, and a served
kernel is found by its source, so the serving side never needs it (its JIT fallback compiles without)."""

_CAPTURE_LOCK = threading.Lock()
CAPTURE_DIR_NAME = "precompile-capture-kernels"
"""What the capture's kernel dir is called in what its libraries embed (see `reproducible`)."""
# Where a capture's Triton files go inside its cache dir (and Inductor's own default for device 0).
_TRITON_DIR = "triton/0"
# ISA probe libraries an earlier capture of this process built: seeded into the next capture's
# dir, so probing costs a load rather than a compile there, and still lands in its bundle.
_PROBES: dict[str, bytes] = {}


@dataclass(frozen=True)
class KernelBuild:
    """Where a capture's kernels compile (a private Inductor cache dir, lent by `kernel_dir`) and the
    C++ build command lines seen while they did."""

    directory: Path
    commands: list[str]
    lent: KernelDir
    precompiled_headers: bool = PRECOMPILED_HEADERS
    """Whether kernels build with them (not where torch keeps them is another user's to write)."""

    def held(self) -> contextlib.AbstractContextManager[Path]:
        """The dir, this capture's alone for the block: around whatever compiles into it or reads it."""
        return self.lent.held()


@contextlib.contextmanager
def private_inductor_cache() -> Iterator[KernelBuild]:
    """Point Inductor at the capture's kernel dir with the settings artifacts are keyed by; observe build commands.

    The dir is fixed per user (and per rank) and lent to one capture at a time: compile and read it
    only inside the KernelBuild's `held()` (kernel_dir.py says why and how). Captures in threads of
    one process take turns for the whole block (Inductor's settings are the process's). Yields the
    KernelBuild whose commands the C++ build command lines are appended to.
    """
    import torch

    from precompile.serve.ranks import kernel_dir_suffix
    from precompile.torch_compat import cpp_builder, inductor_config, temporary_cache_dir

    suffix = kernel_dir_suffix()
    headers = PRECOMPILED_HEADERS and _headers_are_ours()
    commands: list[str] = []
    original = cpp_builder.CppBuilder.get_command_line

    def observed(self):
        line = reproducible(original(self), directory)
        commands.append(line)
        return line

    with _CAPTURE_LOCK:
        lent = KernelDir(Path(tempfile.gettempdir()) / f"{CAPTURE_DIR_NAME}-{os.getuid()}{suffix}",
                         rank=bool(suffix), keep=torch.cuda.is_available(), fill=_seed_probes)
        directory = lent.directory
        cpp_builder.CppBuilder.get_command_line = observed
        try:
            with temporary_cache_dir(str(directory)), triton_cache.triton_block(directory / _TRITON_DIR), inductor_config.patch(
                cpp_cache_precompile_headers=headers, **_triton_in_this_process()
            ), _inductor_triton_memo_set_aside():
                _forget_isa_probes()
                yield KernelBuild(directory, commands, lent, headers)
            # Only the probes: the Triton check ran inside the block (freeze), where the kernels the
            # block compiled were still apart from those of the process before it.
            built = lent.files()
            for relative, (kind, data) in (_kernel_files(built) if built is not None else {}).items():
                if kind.startswith("isa-probe"):
                    _PROBES[relative] = data
        finally:
            cpp_builder.CppBuilder.get_command_line = original
            lent.close()


def _headers_are_ours() -> bool:
    """Whether the capture may build with precompiled headers: Inductor reads the header from torch's
    default root (`$TMPDIR/torchinductor_<user>/precompiled_headers`), a name another user can take
    first and plant a header in that every kernel would `-include` and the bundle would ship. Where
    that dir is not this user's alone, kernels build without (slower), with a warning saying why."""
    from precompile.serve.kernel_root import headers_problem

    found = headers_problem()
    if found is not None:
        warnings.warn(
            f"building kernels without precompiled headers: Inductor keeps them under {found}, so another user "
            "could plant a header every kernel includes; the capture is slower, the kernels the same. Remedy: set "
            "TMPDIR to a directory whose torchinductor_<user> is yours alone (mode 0700)",
            PrecompileWarning, stacklevel=4)
    return found is None


def _seed_probes(directory: Path) -> None:
    for relative, data in _PROBES.items():
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / relative).write_bytes(data)


def _triton_in_this_process() -> dict[str, int]:
    """On a CUDA machine, Inductor's compiles in this process (compile_threads=1): Triton then compiles
    under the block's cache dir and settings, as a serving process does, where a worker pool would
    compile under its own (the first GPU check's serving process missed the kernels; whether the pool
    was part of why is not yet known). Elsewhere Inductor keeps its threads: its C++ builds run side by
    side, as torch.compile's do (GPT-2's capture took 1.4x a cold torch.compile with one thread)."""
    import torch

    return {"compile_threads": 1} if torch.cuda.is_available() else {}


@contextlib.contextmanager
def _inductor_triton_memo_set_aside() -> Iterator[None]:
    """Inductor's in-process memo of compiled Triton kernels (by source), emptied for the block: a kernel
    this process compiled before (an earlier capture, a torch.compile) is compiled again into the
    block's dir, where it lands in the bundle, instead of being reused from memory. Afterwards the
    block's entries are laid over the earlier ones, as for Triton's own caches (triton_cache.py)."""
    from precompile.torch_compat import compiled_triton_kernels as memo

    earlier = dict(memo)
    memo.clear()
    try:
        yield
    finally:
        memo.update({source: future for source, future in earlier.items() if source not in memo})


def reproducible(command: str, capture_dir: Path) -> str:
    """A C++ build command that writes no path of this venv or of TMPDIR into what the library runs:
    the site-packages torch's headers come from, Python's include dir and the capture's kernel dir
    are mapped to fixed names (`-ffile-prefix-map`, as reproducible-builds practice does), for
    `__FILE__` in torch's headers and in a kernel's own index bounds checks (TORCH_CHECK, .rodata) and
    the debug info. Two builds of one source with the same flags and compiler then give libraries
    whose loaded sections are the same bytes wherever torch lives and whatever TMPDIR is, so
    `precompile diff` can compare what a library runs. The capture dir is mapped only in the commands
    that name it, the ones that build: Inductor keys a kernel on the command it gets for placeholder
    file names, which must not hold TMPDIR (it would reach the library's file name). Compilers other
    than gcc and clang get the command as it is."""
    compiler, _, rest = command.partition(" ")
    if not rest or not os.path.basename(compiler).startswith(("g++", "gcc", "c++", "clang", "cc")):
        return command
    roots = {sysconfig.get_paths()["purelib"]: "site-packages", sysconfig.get_paths()["include"]: "python-include"}
    if str(capture_dir) in rest:
        roots[str(capture_dir)] = CAPTURE_DIR_NAME
    return " ".join([compiler, *(f"-ffile-prefix-map={root}={name}" for root, name in roots.items()), rest])


def _forget_isa_probes() -> None:
    """Drop Inductor's in-process memo of its ISA probes so they build again into this capture's dir.

    The serving process's Inductor needs the probe libraries to pick the same ISA without
    compiling; a capture must bundle them whatever ran earlier in this process.
    """
    from precompile.torch_compat import cpu_vec_isa

    for value in vars(cpu_vec_isa).values():
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            clear = getattr(member, "cache_clear", None)
            if callable(clear):
                clear()


def producer_keys(files: dict[str, tuple[str, bytes]]) -> dict[str, str]:
    """What the bundled kernels depend on (see schema/bundle_keys.py): this build, this CPU and its
    vector ISA, and for a bundle holding Triton kernels, the GPU and Triton they were built for."""
    from precompile.torch_compat import cpu_vec_isa

    keys = bundle_keys.host_keys()
    keys["isa"] = str(cpu_vec_isa.pick_vec_isa())
    keys["valid_isas"] = ";".join(str(isa) for isa in cpu_vec_isa.valid_vec_isa_list())
    if any(kind == "triton" for kind, _ in files.values()):
        keys.update(gpu_keys())
    return keys


def producer_provenance(commands: list[str], cache_dir: Path, precompiled_headers: bool = PRECOMPILED_HEADERS) -> dict[str, str]:
    """Where this build lives and how it compiled: recorded for information, never required of a host.
    The command hash covers the builds of the capture's own dir (kernels, ISA probes), its paths left
    out: Inductor's checks of its precompiled header run in a fresh temporary dir, once per process,
    and would make two captures of one model differ."""
    root = str(cache_dir)
    normalized = sorted({" ".join(t for t in line.replace(root, "<cache>").split() if "<cache>" not in t)
                         for line in commands if root in line})
    compilers = sorted({os.path.basename(line.split()[0]) for line in commands if line.split()})
    return {
        **bundle_keys.host_provenance(),
        "compiler": " ".join(compilers),
        "compiler_command_sha256": hashlib.sha256("\n".join(normalized).encode("utf-8")).hexdigest(),
        "precompiled_headers": "on" if precompiled_headers else "off",
    }
