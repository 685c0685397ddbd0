"""Priming a serving process from the cache's kernel bundle (frozen by capture/kernels.py).

Priming extracts the bundle into Inductor's cache dir layout (so a JIT fallback hits it too) and
hands python_code a map from each kernel's source sha256 to its library, which its kernel loader
uses without importing torch._inductor. Nothing here imports torch._inductor at load.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from precompile.artifact import bundle_keys, triton_groups
from precompile.artifact.bundle_rules import destination
from precompile.artifact.envelope import KernelBundle
from precompile.serve import kernel_root, triton_cache


def built_from(source: str, built: dict[str, str]) -> str | None:
    """The library in `built` ({library: the C++ file it was built from}) of a kernel's source.
    Inductor builds each kernel from a `<key>.main.cpp` holding its source followed by the Python
    binding it appends; should one kernel's source begin with another's, the closest fit wins."""
    candidates = sorted((len(text), library) for library, text in built.items() if text.startswith(source))
    return candidates[0][1] if candidates else None


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
            keys["triton_key"] = _triton_key_as_triton_compiles()
    with contextlib.suppress(Exception):
        from triton._C.libtriton import get_cache_invalidating_env_vars

        keys["triton_env"] = " ".join(f"{k}={v}" for k, v in sorted(get_cache_invalidating_env_vars().items()))
    return keys


def _triton_key_as_triton_compiles() -> str:
    """torch.utils._triton.triton_hash_with_backend's value (Triton's build hash and its backend's, so
    the keys of bundles already written still match), read as Triton's next compile reads them: with
    the ptxas Inductor compiles with (triton_cache.pick_ptxas_as_inductor_does), as in the capture
    block, and a backend made afresh, as triton.compile makes one. torch's helper keeps the first value
    of the process, and each backend its first version of ptxas: read before torch's ptxas was picked,
    a serving process keyed the bundle by Triton's own, judged it built for another assembler and
    dropped its kernels, then compiled them under no_compilation() (the second GPU check)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key
    from triton.runtime.driver import driver

    triton_cache.pick_ptxas_as_inductor_does()
    backend = make_backend(driver.active.get_current_target())
    return hashlib.sha256(f"{triton_key()}-{backend.hash()}".encode()).hexdigest().upper()


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
    from precompile.torch_compat import cpu_vec_isa

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

    from precompile.torch_compat import AsyncCompile, inductor_tensor_data_ptr

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
            assert spec is not None and spec.loader is not None  # a bundled kernel is a .so: an extension module
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
    (with its autotuning cache on), so captured Triton kernels launch without compiling or tuning;
    its group files name their kernels' files there (artifact/triton_groups.py).
    """
    triton_dir = triton_cache.serving_dir(cache_dir)
    targets = {entry.path: destination(entry.path, cache_dir, triton_dir) for entry in bundle.files}
    contents = {entry.path: (files[entry.path], entry.sha256) for entry in bundle.files}
    bundled = set(targets)
    for path, (data, _) in contents.items():
        if triton_groups.is_group(path):  # its kernel's files, at their paths here (before anything is changed)
            data = triton_groups.served(data, path, bundled, targets.__getitem__)
            contents[path] = data, hashlib.sha256(data).hexdigest()
    if any(entry.path.startswith("triton/") for entry in bundle.files):
        unsafe = kernel_root.problem(triton_dir)
        if unsafe is not None:
            raise OSError(f"not writing Triton kernels into {triton_dir}: {unsafe}; set TRITON_CACHE_DIR to a directory "
                          "you own that no one else can write (mode 0700)")
        triton_cache.serve_from(triton_dir)
    for path, (data, digest) in contents.items():
        _place(targets[path], data, digest)
    return {digest: str(targets[path]) for digest, path in bundle.kernels.items()}


def _place(target: Path, data: bytes, digest: str) -> None:
    """Write `data` at `target` unless it is there already, never through a symlink and never over a
    file another process is writing (O_NOFOLLOW | O_EXCL on a temporary name, then a rename), and read
    it back through a descriptor of its own: a library whose bytes are not the bundle's sha256
    `digest` is refused (OSError) before python_code maps it. The root is one no other user can write
    (kernel_root), so nothing else can replace it between this check and the dlopen that follows."""
    if _holds(target, digest):
        return
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, target)
    if not _holds(target, digest):
        raise OSError(f"the kernel file {target} does not hold the bytes just written (sha256 {digest}): "
                      "something else replaced it; not loading it")


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _holds(target: Path, digest: str) -> bool:
    """Whether `target` is a regular file (not a symlink) of this user whose bytes have sha256 `digest`."""
    try:
        descriptor = os.open(target, os.O_RDONLY | _NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(descriptor, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            return False
        return hashlib.sha256(handle.read()).hexdigest() == digest
