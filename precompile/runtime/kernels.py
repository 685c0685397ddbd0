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
import importlib.util
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from precompile.errors import PrecompileError
from precompile.runtime import triton_cache
from precompile.schema import bundle_keys
from precompile.schema.bundle_rules import destination, kind_of
from precompile.schema.envelope import KernelBundle

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


def collect_files(cache_dir: Path) -> dict[str, tuple[str, bytes]]:
    """The kernel files in a private cache dir, {relative path: (kind, bytes)}.

    Raises PrecompileError naming each Triton kernel or autotune decision of the capture's block
    that is not among them (so it could not be frozen).
    """
    missing = triton_cache.unfrozen(cache_dir / _TRITON_DIR)
    if missing:
        raise PrecompileError(
            "could not freeze the Triton kernels the serving process needs: " + "; ".join(missing)
            + ". Let Triton compile them inside the capture block with its default file cache manager"
        )
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
    return {name: hashlib.sha256(text.encode("utf-8")).hexdigest() for name, text in kernel_texts(source).items()}


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


def libraries_by_source(modules, files: dict[str, tuple[str, bytes]]) -> dict[str, str]:
    """{sha256 of a kernel's C++ source: its library's path in `files`} for the kernels of the Inductor
    output modules `modules` (their source texts), matched by content (see `built_from`)."""
    built = {
        path[: -len(".cpp")] + ".so": data.decode("utf-8", "replace")
        for path, (kind, data) in files.items()
        if kind == "kernel-source" and path[: -len(".cpp")] + ".so" in files
    }
    found = {}
    for module in modules:
        for text in kernel_texts(module).values():
            library = built_from(text, built)
            if library is not None:
                found[hashlib.sha256(text.encode("utf-8")).hexdigest()] = library
    return found


def built_from(source: str, built: dict[str, str]) -> str | None:
    """The library in `built` ({library: the C++ file it was built from}) of a kernel's source.
    Inductor builds each kernel from a `<key>.main.cpp` holding its source followed by the Python
    binding it appends; should one kernel's source begin with another's, the closest fit wins."""
    candidates = sorted((len(text), library) for library, text in built.items() if text.startswith(source))
    return candidates[0][1] if candidates else None


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
# Where a capture's Triton files go inside its cache dir (and Inductor's own default for device 0).
_TRITON_DIR = "triton/0"
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
    from precompile.runtime.torch_compat import cpp_builder, inductor_config, temporary_cache_dir
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
            with temporary_cache_dir(str(directory)), triton_cache.triton_block(directory / _TRITON_DIR), inductor_config.patch(
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


def _forget_isa_probes() -> None:
    """Drop Inductor's in-process memo of its ISA probes so they build again into this capture's dir.

    The serving process's Inductor needs the probe libraries to pick the same ISA without
    compiling; a capture must bundle them whatever ran earlier in this process.
    """
    from precompile.runtime.torch_compat import cpu_vec_isa

    for value in vars(cpu_vec_isa).values():
        members = vars(value).values() if isinstance(value, type) else (value,)
        for member in members:
            clear = getattr(member, "cache_clear", None)
            if callable(clear):
                clear()


def producer_keys(files: dict[str, tuple[str, bytes]]) -> dict[str, str]:
    """What the bundled kernels depend on (see schema/bundle_keys.py): this build, this CPU and its
    vector ISA, and for a bundle holding Triton kernels, the GPU and Triton they were built for."""
    from precompile.runtime.torch_compat import cpu_vec_isa

    keys = bundle_keys.host_keys()
    keys["isa"] = str(cpu_vec_isa.pick_vec_isa())
    keys["valid_isas"] = ";".join(str(isa) for isa in cpu_vec_isa.valid_vec_isa_list())
    if any(kind == "triton" for kind, _ in files.values()):
        keys.update(gpu_keys())
    return keys


def producer_provenance(commands: list[str], cache_dir: Path) -> dict[str, str]:
    """Where this build lives and how it compiled: recorded for information, never required of a host."""
    root = str(cache_dir)
    normalized = sorted({" ".join(t for t in line.replace(root, "<cache>").split() if "<cache>" not in t) for line in commands})
    compilers = sorted({os.path.basename(line.split()[0]) for line in commands if line.split()})
    return {
        **bundle_keys.host_provenance(),
        "compiler": " ".join(compilers),
        "compiler_command_sha256": hashlib.sha256("\n".join(normalized).encode("utf-8")).hexdigest(),
        "precompiled_headers": "off",
    }


def gpu_keys() -> dict[str, str]:
    """What Triton kernels depend on, as this process sees it: the current GPU's compute capability,
    the Triton release, Triton's build hash combined with its GPU backend's (the assembler version
    and target architecture: what Triton's own cache key holds beside the kernel and its options),
    and the environment variables Triton lets invalidate its cache."""
    import torch

    keys = {"gpu_capability": "no CUDA device", "triton": bundle_keys.triton_version(), "triton_key": "no GPU backend",
            "triton_env": ""}
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        keys["gpu_capability"] = f"{major}.{minor}"
        with contextlib.suppress(Exception):  # no Triton, or one whose backend cannot load here
            from precompile.runtime.torch_compat import triton_hash_with_backend

            keys["triton_key"] = triton_hash_with_backend()
    with contextlib.suppress(Exception):
        from triton._C.libtriton import get_cache_invalidating_env_vars

        keys["triton_env"] = " ".join(f"{k}={v}" for k, v in sorted(get_cache_invalidating_env_vars().items()))
    return keys


def serving_keys(recorded: dict[str, str]) -> dict[str, str]:
    """This serving process's values of the requirements a bundle records (torch is imported here)."""
    keys = bundle_keys.host_keys()
    if bundle_keys.is_gpu_bundle(recorded):
        keys.update(gpu_keys())
    return keys


@contextlib.contextmanager
def producer_vec_isas(keys: dict[str, str]) -> Iterator[None]:
    """Let Inductor take the producer's valid vector ISAs instead of probing this host for them.

    Inductor probes each candidate ISA by building a test library and loading it in a fresh Python
    process (about 0.25 s each). A bundle only reaches here when this host has every CPU flag the
    producer had, so the producer's probe results hold here, and they pick the very ISA its kernels
    were keyed by. Only while an artifact loads; a bundle without the key probes as usual.
    """
    from precompile.runtime.torch_compat import cpu_vec_isa

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


@contextlib.contextmanager
def inductor_serves_from(primed: dict[str, str], built: dict[str, str]) -> Iterator[None]:
    """While a Dynamo artifact builds its subgraphs, Inductor takes each C++ kernel the bundle holds
    from its library, found by the sha256 of the kernel's source (`primed`), as a MakeFx artifact's
    kernel runtime does; or, for a bundle written before it recorded that map, by the C++ file the
    library was built from (`built`, see `built_sources`). Inductor's own lookup keys a kernel on its
    full build command, which names this host's torch and Python include dirs: another install of
    the same build would miss and compile."""
    import sys

    from precompile.runtime.torch_compat import AsyncCompile, inductor_tensor_data_ptr

    original = AsyncCompile.cpp_pybinding

    def cpp_pybinding(self, argtypes, source_code):
        path = primed.get(hashlib.sha256(source_code.encode("utf-8")).hexdigest()) or built_from(source_code, built)
        if path is None:
            return original(self, argtypes, source_code)
        os.environ["_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR"] = str(inductor_tensor_data_ptr)
        name = os.path.basename(path).split(".")[0] + ".kernel"
        module = sys.modules.get(name)
        if module is None:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
        return module.kernel

    AsyncCompile.cpp_pybinding = cpp_pybinding
    try:
        yield
    finally:
        AsyncCompile.cpp_pybinding = original


def built_sources(bundle: KernelBundle, cache_dir: Path) -> dict[str, str]:
    """{absolute library path: the C++ file it was built from} of a primed bundle without a kernels
    map (written before it recorded one); {} for a bundle that has the map."""
    if bundle.kernels:
        return {}
    paths = {entry.path for entry in bundle.files}
    return {
        str(cache_dir / library): (cache_dir / entry.path).read_text(encoding="utf-8", errors="replace")
        for entry in bundle.files
        if entry.kind == "kernel-source" and (library := entry.path[: -len(".cpp")] + ".so") in paths
    }


def prime(bundle: KernelBundle, files: dict[str, bytes], cache_dir: Path) -> dict[str, str]:
    """Extract the bundle into `cache_dir`; return {kernel source sha256: absolute library path}.

    Triton's files go where this process's Triton reads its cache, and Triton is pointed there
    (with its autotuning cache on), so captured Triton kernels launch without compiling or tuning.
    """
    triton_dir = triton_cache.serving_dir(cache_dir)
    targets = {entry.path: destination(entry.path, cache_dir, triton_dir) for entry in bundle.files}
    if any(entry.path.startswith("triton/") for entry in bundle.files):
        triton_cache.serve_from(triton_dir)
    for entry in bundle.files:
        _place(targets[entry.path], files[entry.path])
    return {digest: str(targets[path]) for digest, path in bundle.kernels.items()}


def _place(target: Path, data: bytes) -> None:
    """Write `data` at `target` (a regular file, never through a symlink), unless it is there already."""
    with contextlib.suppress(OSError):
        if not target.is_symlink() and target.stat().st_size == len(data) and target.read_bytes() == data:
            return
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, target)
