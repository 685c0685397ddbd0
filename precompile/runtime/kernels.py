"""The kernel bundle: compile into a private cache dir at capture, freeze what the serving process
needs into the cache file, and prime a serving process from it.

Priming extracts the bundle into Inductor's cache dir layout (so a JIT fallback hits it too) and
hands python_code a map from each kernel's source sha256 to its library, which its kernel loader
uses without importing torch._inductor. Nothing here that runs at load imports torch._inductor.
"""
from __future__ import annotations

import ast
import contextlib
import getpass
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from precompile.schema.bundle_keys import host_keys
from precompile.schema.envelope import KernelBundle

# Bundle file kinds, by how the file is named in Inductor's cache dir.
_KINDS = (
    (re.compile(r"^[^/]+/[^/]+\.main\.so$"), "kernel"),
    (re.compile(r"^[^/]+/[^/]+\.main\.cpp$"), "kernel-source"),
    (re.compile(r"^[^/]+/[^/]+\.so$"), "isa-probe"),
    (re.compile(r"^[^/]+/[^/]+\.cpp$"), "isa-probe-source"),
    (re.compile(r"^[^/]+/[^/]+\.best_config$"), "autotune-result"),
    (re.compile(r"^triton/"), "triton"),
)


def inductor_cache_dir() -> Path:
    """Inductor's kernel cache dir, computed as torch._inductor computes it, without importing it."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return Path(configured)
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def kind_of(path: str) -> str | None:
    if path.startswith("locks/") or path.endswith((".lock", ".py")):
        return None
    for pattern, kind in _KINDS:
        if pattern.search(path):
            return kind
    return None


def collect_files(cache_dir: Path) -> dict[str, tuple[str, bytes]]:
    """The kernel files in a private cache dir, {relative path: (kind, bytes)}."""
    files = {}
    for path in sorted(cache_dir.rglob("*")):
        if not path.is_file():
            continue
        relative = path.relative_to(cache_dir).as_posix()
        kind = kind_of(relative)
        if kind is not None:
            files[relative] = (kind, path.read_bytes())
    return files


def kernel_sources(source: str) -> dict[str, str]:
    """{kernel name: sha256 of its C++ source} for every `name = async_compile.cpp_pybinding(types, src)`."""
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
            found[node.targets[0].id] = hashlib.sha256(call.args[1].value.encode("utf-8")).hexdigest()
    return found


def kernel_libraries(namespace: dict, cache_dir: Path) -> dict[str, str]:
    """{kernel name: library path relative to cache_dir} for the kernels an exec'd module loaded."""
    root = os.path.realpath(cache_dir)
    found = {}
    for name, value in namespace.items():
        module = getattr(value, "__self__", None)
        library = getattr(module, "__file__", None)
        if isinstance(library, str) and os.path.realpath(library).startswith(root + os.sep):
            found[name] = Path(os.path.relpath(os.path.realpath(library), root)).as_posix()
    return found


_CAPTURE_LOCK = threading.Lock()
# ISA probe libraries an earlier capture of this process built: seeded into the next capture's
# dir, so probing costs a load rather than a compile there, and still lands in its bundle.
_PROBES: dict[str, bytes] = {}


@contextlib.contextmanager
def private_inductor_cache() -> Iterator[tuple[Path, list[str]]]:
    """Compile into an emptied cache dir with the settings artifacts are keyed by; observe build commands.

    The dir's path is fixed per user (and per rank, in a torch.distributed world) because compiled
    libraries embed the path they were built in: a fixed path keeps two captures of the same model
    byte-identical, so diffs show real changes. Single-process captures on this host take turns (a
    thread lock and a file lock). A rank never waits for the file lock, since the block it guards
    runs collectives that other ranks wait on: when another job holds its dir, it compiles into a
    dir of its own process instead. Yields the directory and the list the C++ build command lines
    are appended to.
    """
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    from precompile.runtime.distributed import kernel_dir_suffix

    suffix = kernel_dir_suffix()
    directory = Path(tempfile.gettempdir()) / f"precompile-capture-kernels-{os.getuid()}{suffix}"
    commands: list[str] = []
    original = cpp_builder.CppBuilder.get_command_line

    def observed(self):
        line = original(self)
        commands.append(line)
        return line

    with _CAPTURE_LOCK, _locked_dir(directory, wait=not suffix) as directory:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        cpp_builder.CppBuilder.get_command_line = observed
        try:
            for relative, data in _PROBES.items():
                (directory / relative).parent.mkdir(parents=True, exist_ok=True)
                (directory / relative).write_bytes(data)
            with temporary_cache_dir(str(directory)), _triton_cache_in(directory / "triton"), inductor_config.patch(
                cpp_cache_precompile_headers=False
            ):
                _forget_isa_probes()
                yield directory, commands
            for relative, (kind, data) in collect_files(directory).items():
                if kind.startswith("isa-probe"):
                    _PROBES[relative] = data
        finally:
            cpp_builder.CppBuilder.get_command_line = original
            shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _locked_dir(directory: Path, *, wait: bool) -> Iterator[Path]:
    """Hold `directory`'s file lock and yield it; without `wait`, a dir held by another process is
    swapped for this process's own (its kernels then embed that path)."""
    import fcntl

    with open(f"{directory}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = True
        except BlockingIOError:
            held = False
        if held:
            yield directory
            return
    own = directory.with_name(f"{directory.name}-pid{os.getpid()}")
    try:
        with _locked_dir(own, wait=True) as own:
            yield own
    finally:
        with contextlib.suppress(OSError):
            os.unlink(f"{own}.lock")


@contextlib.contextmanager
def _triton_cache_in(directory: Path) -> Iterator[None]:
    """Triton compiles into the capture's dir, whatever TRITON_CACHE_DIR says, so its kernels ship."""
    original = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = str(directory / "0")
    try:
        yield
    finally:
        if original is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = original


def _forget_isa_probes() -> None:
    """Drop Inductor's in-process memo of its ISA probes so they build again into this capture's dir.

    The serving process's Inductor needs the probe libraries to pick the same ISA without
    compiling; a capture must bundle them whatever ran earlier in this process.
    """
    from torch._inductor import cpu_vec_isa

    for value in vars(cpu_vec_isa).values():
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            clear = getattr(member, "cache_clear", None)
            if callable(clear):
                clear()


def producer_keys(commands: list[str], cache_dir: Path) -> dict[str, str]:
    """host_keys() plus what only the capturing process knows: ISA, compiler command-line hash, PCH."""
    from torch._inductor import cpu_vec_isa

    root = str(cache_dir)
    normalized = sorted({" ".join(t for t in line.replace(root, "<cache>").split() if "<cache>" not in t) for line in commands})
    return {
        **host_keys(),
        "isa": str(cpu_vec_isa.pick_vec_isa()),
        "valid_isas": ";".join(str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()),
        "compiler_command_sha256": hashlib.sha256("\n".join(normalized).encode("utf-8")).hexdigest(),
        "precompiled_headers": "off",
    }


@contextlib.contextmanager
def producer_vec_isas(keys: dict[str, str]) -> Iterator[None]:
    """Let Inductor take the producer's valid vector ISAs instead of probing this host for them.

    Inductor probes each candidate ISA by building a test library and loading it in a fresh Python
    process (about 0.25 s each). A bundle only reaches here when this host has every CPU flag the
    producer had, so the producer's probe results hold here, and they pick the very ISA its kernels
    were keyed by. Only while an artifact loads; a bundle without the key probes as usual.
    """
    from torch._inductor import cpu_vec_isa

    names = [name for name in keys.get("valid_isas", "").split(";") if name]
    known = {str(isa): isa for isa in cpu_vec_isa.supported_vec_isa_list}
    chosen = [known[name] for name in names if name in known]  # in the producer's order
    if not names or len(chosen) != len(names):
        yield
        return
    original = cpu_vec_isa.valid_vec_isa_list
    cpu_vec_isa.valid_vec_isa_list = lambda: list(chosen)
    try:
        yield
    finally:
        cpu_vec_isa.valid_vec_isa_list = original


def _destination(path: str, cache_dir: Path) -> Path:
    """Where a bundle file goes: Inductor's cache dir layout, Triton's files where Triton looks."""
    if path.startswith("/") or ".." in path.split("/"):
        raise ValueError(f"bundle path {path!r} escapes the cache dir")
    triton_dir = os.environ.get("TRITON_CACHE_DIR")
    if triton_dir and path.startswith("triton/"):
        return Path(triton_dir) / path.split("/", 2)[2]
    return cache_dir / path


def prime(bundle: KernelBundle, files: dict[str, bytes], cache_dir: Path) -> dict[str, str]:
    """Extract the bundle into `cache_dir`; return {kernel source sha256: absolute library path}."""
    for entry in bundle.files:
        target = _destination(entry.path, cache_dir)
        data = files[entry.path]
        with contextlib.suppress(OSError):
            if target.stat().st_size == len(data) and target.read_bytes() == data:
                continue
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, target)
    return {digest: str(cache_dir / path) for digest, path in bundle.kernels.items()}
