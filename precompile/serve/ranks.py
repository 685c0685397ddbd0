"""Capture once, serve on every rank: precompile over torch.distributed.

An SPMD capture runs the capture block on every rank (so the collectives inside it complete), each
rank compiling into its own kernel dir; only the writer rank writes the pair, and every rank learns
whether the capture succeeded everywhere. An artifact whose graphs call collectives records the
world they ran in. `load_everywhere` reads the pair on one rank and ships its bytes to all.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from precompile.artifact.metadata import CapturedWorld, ProcessGroupRecord
from precompile.artifact.pair import read_bytes
from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE
from precompile.errors import PrecompileError
from precompile.signing.pair import TrustedKeys

# A collective in rendered graph source (ATen or Inductor output code): its op and, where it talks
# to a group, the group name as the last string argument.
_COLLECTIVE = re.compile(r"torch\.ops\._c10d_functional\.(\w+?)_?\.default\(([^\n]*)\)")
_GROUP_NAME = re.compile(r"'([^']*)'\s*$")
_DIGEST_SIZE = 32  # sha256


def _initialized():
    """torch.distributed when a process group is initialized in this process, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def rank_and_size() -> tuple[int, int] | None:
    """(rank, world size) of the default process group when this process runs in one of size > 1."""
    dist = _initialized()
    if dist is None or dist.get_world_size() < 2:
        return None
    return dist.get_rank(), dist.get_world_size()


def kernel_dir_suffix() -> str:
    """What tells one rank's private kernel dir from another's on one host: nothing outside a world."""
    placed = rank_and_size()
    return "" if placed is None else f"-rank{placed[0]}"


def check_writer_rank(writer_rank: int) -> None:
    if isinstance(writer_rank, bool) or not isinstance(writer_rank, int) or writer_rank < 0:
        raise PrecompileError(f"capture() writer_rank must be a rank (an int >= 0), got {writer_rank!r}")
    placed = rank_and_size()
    if placed is not None and writer_rank >= placed[1]:
        raise PrecompileError(
            f"capture() writer_rank={writer_rank} is not a rank of this world of size {placed[1]}; "
            f"pass a rank from 0 to {placed[1] - 1}"
        )


def writes_here(writer_rank: int) -> bool:
    """Whether this process writes the pair: always outside a world, else only the writer rank."""
    placed = rank_and_size()
    return placed is None or placed[0] == writer_rank


def agree(failure: str | None, writer_rank: int) -> None:
    """Every rank states how its part ended (None: fine); a rank whose part was fine raises
    PrecompileError naming the ranks that failed. Nothing outside a world."""
    placed = rank_and_size()
    if placed is None:
        return
    outcomes = _all_gather_texts("" if failure is None else failure)
    failed = {rank: text for rank, text in enumerate(outcomes) if text}
    if failure is None and failed:
        listed = "; ".join(f"rank {rank}: {text}" for rank, text in sorted(failed.items()))
        raise PrecompileError(
            f"the capture failed on {'rank' if len(failed) == 1 else 'ranks'} {', '.join(map(str, sorted(failed)))} "
            f"({listed}); whatever writer rank {writer_rank} wrote did not complete on every rank: fix it and capture again"
        )


def _as_bytes(tensor) -> bytes:
    """The bytes of a contiguous CPU uint8 tensor (torch here may have no numpy)."""
    return ctypes.string_at(tensor.data_ptr(), tensor.numel()) if tensor.numel() else b""


def _as_tensor(data: bytes, device):
    import torch

    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else torch.empty(0, dtype=torch.uint8, device=device)


def _device(dist):
    """Where the default group's collectives take tensors: NCCL's on this rank's GPU."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_gather_texts(text: str) -> list[str]:
    """Every rank's `text`, by rank, as raw bytes over the default group (nothing is pickled)."""
    import torch

    dist = _initialized()
    device = _device(dist)
    data = text.encode("utf-8")
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device))
    longest = max(int(size.item()) for size in sizes)
    padded = [torch.zeros(longest, dtype=torch.uint8, device=device) for _ in sizes]
    dist.all_gather(padded, _as_tensor(data.ljust(longest, b"\0"), device))
    return [_as_bytes(chunk.cpu())[: int(size.item())].decode("utf-8", "replace") for chunk, size in zip(padded, sizes)]


@contextlib.contextmanager
def traceable_collectives() -> Iterator[None]:
    """While make_fx traces, the in-place torch.distributed collectives (dist.all_reduce, ...) call
    torch's traceable functional twins, as Dynamo does, so they trace as _c10d_functional ops."""
    dist = _initialized()
    if dist is None:
        yield
        return
    import torch.distributed.distributed_c10d as c10d

    from precompile.torch_compat import traceable_collective_remaps

    patched = []
    for module in (dist, c10d):
        for name, value in list(vars(module).items()):
            twin = traceable_collective_remaps.get(value) if callable(value) else None
            if twin is not None:
                patched.append((module, name, value))
                setattr(module, name, twin)
    try:
        yield
    finally:
        for module, name, value in patched:
            setattr(module, name, value)


def captured_world(graph_sources: Iterable[str]) -> CapturedWorld | None:
    """The world the rendered graphs depend on: None when they call no collective."""
    collectives, group_names = set(), set()
    for source in graph_sources:
        for match in _COLLECTIVE.finditer(source):
            if match.group(1) != "wait_tensor":
                collectives.add(match.group(1))
                named = _GROUP_NAME.search(match.group(2))
                if named:
                    group_names.add(named.group(1))
    if not collectives:
        return None
    dist = _initialized()
    if dist is None:
        raise PrecompileError(
            f"the captured graphs call collectives {sorted(collectives)} but no torch.distributed process group "
            "is initialized here; initialize one before capturing"
        )
    from precompile.torch_compat import resolve_process_group as _resolve_process_group

    groups = tuple(
        ProcessGroupRecord(name=name, ranks=tuple(dist.get_process_group_ranks(_resolve_process_group(name))))
        for name in sorted(group_names)
    )
    return CapturedWorld(
        size=dist.get_world_size(), backend=str(dist.get_backend()), groups=groups, collectives=tuple(sorted(collectives))
    )


def load_everywhere(artifact_path: str | os.PathLike, cache_path: str | os.PathLike, *, src: int = 0,
                    trusted_keys: TrustedKeys | None = None, expect_name: str | None = None,
                    min_release: str | int | None = None):
    """Load one artifact on every rank of the default process group; the files need only exist on `src`.

    Call it on every rank with the same arguments. Rank `src` reads both files (and the pair's
    signature NAME.sig, if there is one; given URLs, it fetches them as load does) and broadcasts
    their bytes and sha256 over the default group (raw bytes in tensors: nothing is pickled); every other rank checks the digests, writes them into a
    private temporary dir and loads the pair from there. Every rank loads with `trusted_keys` (key
    paths must exist on every rank) and its own PRECOMPILE_TRUSTED_KEYS, so each checks the signature,
    and with `expect_name` / `min_release` and its own PRECOMPILE_EXPECT_NAME / PRECOMPILE_MIN_RELEASE,
    the identity it binds.
    Returns this rank's PrecompiledRunnable; serve it under no_compilation().
    """
    import torch

    from precompile.serve.load import MAX_CACHE_SIZE, fetched_if_urls, load
    from precompile.signing.envelope import MAX_SIGNATURE_SIZE, signature_path

    dist = _initialized()
    if dist is None:
        raise PrecompileError(
            "load_everywhere() needs an initialized torch.distributed process group (e.g. run under torchrun, "
            "or call torch.distributed.init_process_group first); in a single process use precompile.load()"
        )
    size, rank = dist.get_world_size(), dist.get_rank()
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < size:
        raise PrecompileError(f"load_everywhere() src must be a rank of this world of size {size}, got {src!r}")
    given = artifact_path, cache_path
    artifact_path, cache_path = Path(artifact_path), Path(cache_path)
    paths = (artifact_path, cache_path, signature_path(artifact_path))
    device = _device(dist)
    pair, problem = (b"", b"", b""), ""
    if rank == src:
        try:  # as load reads them: regular files only (a FIFO is refused, not waited on), within its limits
            fetched = fetched_if_urls(*given)
            if fetched is not None:  # URLs: rank src fetches them (and the .sig) and ships their bytes as it ships files
                artifact_path, cache_path = fetched.python_code_path, fetched.cache_path
                paths = (artifact_path, cache_path, signature_path(artifact_path))
            signed = os.path.lexists(paths[2])  # an unsigned pair ships no signature
            signature = read_bytes(paths[2], "signature", MAX_SIGNATURE_SIZE) if signed else b""
            pair = (read_bytes(artifact_path, "python_code", MAX_PYTHON_CODE_SIZE),
                    read_bytes(cache_path, "cache", MAX_CACHE_SIZE), signature)
        except PrecompileError as exc:
            problem = f"rank {src} could not read the pair ({artifact_path}, {cache_path}): {exc}"
    sizes = torch.tensor([*map(len, pair), len(problem.encode("utf-8"))], dtype=torch.int64, device=device)
    dist.broadcast(sizes, src=src)
    artifact_size, cache_size, signature_size, problem_size = (int(n) for n in sizes.tolist())
    if problem_size:
        text = _as_tensor(problem.encode("utf-8"), device) if rank == src else torch.empty(problem_size, dtype=torch.uint8, device=device)
        dist.broadcast(text, src=src)
        raise PrecompileError(f"{_as_bytes(text.cpu()).decode('utf-8')}; pass the paths of a pair that exists on rank {src}")
    frame_size = 3 * _DIGEST_SIZE + artifact_size + cache_size + signature_size
    if rank == src:
        frame = b"".join((*(hashlib.sha256(data).digest() for data in pair), *pair))
        payload = _as_tensor(frame, device)
    else:
        payload = torch.empty(frame_size, dtype=torch.uint8, device=device)
    dist.broadcast(payload, src=src)
    if rank == src:
        return load(artifact_path, cache_path, trusted_keys=trusted_keys, expect_name=expect_name, min_release=min_release)
    frame = _as_bytes(payload.cpu())
    digests = [frame[i * _DIGEST_SIZE : (i + 1) * _DIGEST_SIZE] for i in range(3)]
    body = frame[3 * _DIGEST_SIZE :]
    ends = (artifact_size, artifact_size + cache_size)
    received = (body[: ends[0]], body[ends[0] : ends[1]], body[ends[1] :])
    for path, data, digest in zip(paths, received, digests):
        if hashlib.sha256(data).digest() != digest:
            raise PrecompileError(
                f"{path.name} arrived on rank {rank} with sha256 {hashlib.sha256(data).hexdigest()}, but rank {src} "
                f"sent sha256 {digest.hex()}; the transfer corrupted it: call load_everywhere() again"
            )
    with tempfile.TemporaryDirectory(prefix=f"precompile-rank{rank}-") as directory:
        local_artifact, local_cache = Path(directory) / artifact_path.name, Path(directory) / cache_path.name
        local_artifact.write_bytes(received[0])
        local_cache.write_bytes(received[1])
        if received[2]:
            signature_path(local_artifact).write_bytes(received[2])
        return load(local_artifact, local_cache, trusted_keys=trusted_keys, expect_name=expect_name, min_release=min_release)
