"""Hostile caches through `precompile.load`: part 4 of bench/stress.py, and tests/serve/test_load_fuzz.py's slice.

Each case mutates a real fixture pair (mostly fixtures/v1/mlp_inductor, whose cache carries a C++
kernel bundle, its CPU flags made to fit this host so that mutations reach priming and the kernel
loader). The msgpack header is decoded to plain values, changed, and encoded again with lengths,
sizes and hashes made consistent where that lets the mutation reach deeper code: bundle paths,
kinds, sizes and hashes, the kernel map, keys, provenance, format_version, payload framing, zstd
bombs, 200k entries, msgpack nested deep, a FIFO where a file should be.

A long-lived process (this script, started by `fuzz`) imports torch and precompile once and forks one
process per case. That process runs with HOME, TMPDIR, TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR
inside the case's sandbox, its cwd there too, under RLIMIT_AS (its address space at the fork plus
MEMORY_HEADROOM), and reports over a pipe; a watchdog kills it past WATCHDOG_S. Mutations that name
absolute or escaping paths aim at the sandbox's canary dir. A case fails when load ends other than by
returning (with or without a PrecompileWarning) or raising PrecompileError, or hangs, or runs out of
memory, or writes anywhere in the sandbox outside Inductor's and Triton's cache dirs, or maps a shared
library from outside the extracted bundle and the system, Python and torch installs. About a third of
the cases sign their pair (honestly, as an older release, as another model, without identity, by an
untrusted key, or with the signature edited: bench/load_fuzz_signing.py) and load it under pinned keys,
name and release; one the pins refuse fails unless load raises PrecompileError. A failing case's
inputs are kept under the failures dir.

    python bench/load_fuzz.py --cases 0:200,531 [--job 0/1] [--seed 0] --work DIR --failures DIR
    (the long-lived process; prints one JSON line per case)
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import re
import resource
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

# run as a script (the fuzz's long-lived processes), the repository is on PYTHONPATH
from bench import load_fuzz_signing as signed
from precompile.serve.kernel_root import default_cache_dir

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "v1"
WATCHDOG_S = 10.0
"""A case's bound: a load serves in well under a second; only a hang (or a bomb being unpacked) reaches it."""
MEMORY_HEADROOM = 2 * 1024**3
"""Address space a case may add to what the long-lived process had mapped (about 0.7 GiB with torch)."""
MAGIC = b"\x89PCACHE\n"
GIB = 1024**3

OUTCOMES = ("served", "served, compiling its kernels without a warning", "degraded with a PrecompileWarning",
            "PrecompileError", "raw exception", "hang", "memory")
MUST_BE_ZERO = ("raw exception", "hang", "memory", "writes outside the cache roots", "foreign libraries", "served against its pins")


# -- the sandbox ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sandbox:
    """One case's directories; Inductor's and Triton's cache dirs are the only places load may write."""

    root: Path

    @property
    def case_dir(self) -> Path:
        """What is watched for writes: the sandbox and its parent, which a path with '../..' reaches."""
        return self.root.parent

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    @property
    def inductor(self) -> Path:
        return self.root / "inductor"

    @property
    def triton(self) -> Path:
        return self.root / "triton"

    @property
    def canary(self) -> Path:
        return self.root / "canary"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def cwd(self) -> Path:
        return self.root / "cwd"

    @property
    def python_code(self) -> Path:
        return self.inputs / "f.py"

    @property
    def cache(self) -> Path:
        return self.inputs / "f.cache"

    def create(self) -> None:
        for directory in (self.inputs, self.inductor, self.triton, self.canary, self.home, self.tmp, self.cwd):
            directory.mkdir(parents=True)


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """{relative path: (file type, size, mtime)} of everything under `root`, symlinks not followed."""
    entries = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                info = os.lstat(path)
                entries[os.path.relpath(path, root)] = (stat.S_IFMT(info.st_mode), info.st_size, info.st_mtime_ns)
    return entries


def writes_outside_roots(sandbox: Sandbox, before: dict, after: dict) -> list[str]:
    """Entries created, changed or removed in the case dir outside Inductor's and Triton's cache dirs
    (a directory's own mtime aside: it moves whenever an entry inside it does)."""
    # torch's default Inductor root under the case's TMPDIR, beside TORCHINDUCTOR_CACHE_DIR: load claims
    # it (owner-only) before python_code runs, since torch keeps precompiled headers there either way.
    default_root = sandbox.tmp / default_cache_dir().name
    roots = tuple(os.path.relpath(root, sandbox.case_dir) for root in (sandbox.inductor, sandbox.triton, default_root))
    changed = []
    for path in sorted(set(before) | set(after)):
        if any(path == root or path.startswith(root + os.sep) for root in roots):
            continue
        old, new = before.get(path), after.get(path)
        if old != new and not (old and new and old[0] == new[0] == stat.S_IFDIR):
            changed.append(path)
    return changed


# -- cases ---------------------------------------------------------------------------------------
@dataclass
class Draft:
    """A cache being mutated: the envelope as plain msgpack values, and the bundle files' contents."""

    header: object
    blobs: list[bytes]
    payload: bytes = b""
    raw_header: bytes | None = None
    """Set by a mutation that damages the encoded header itself."""
    fifo: bool = False
    """The cache path is a FIFO, not a file."""
    plants: list[Callable[[Sandbox], None]] = field(default_factory=list)
    """What a case puts in its sandbox before load (a library to point at, a FIFO at a destination)."""

    @property
    def bundle(self) -> dict | None:
        bundle = self.header.get("bundle") if isinstance(self.header, dict) else None
        return bundle if isinstance(bundle, dict) else None

    @property
    def entries(self) -> list[dict]:
        files = (self.bundle or {}).get("files")
        return files if isinstance(files, list) and all(isinstance(e, dict) for e in files) else []


@dataclass(frozen=True)
class Base:
    name: str
    python_code: bytes
    header: dict
    blobs: list[bytes]

    def draft(self) -> Draft:
        import msgspec

        return Draft(header=msgspec.msgpack.decode(msgspec.msgpack.encode(self.header)), blobs=list(self.blobs))


def load_bases() -> dict[str, Base]:
    """mlp_inductor with its bundle's CPU flags those of this host (so it is served here), and the eager
    mlp both bare and carrying mlp_inductor's bundle (priming runs whatever the backend)."""
    import msgspec

    from precompile.artifact import bundle_keys
    from precompile.artifact.codec import PREFIX_SIZE, decode_header, decode_payload

    data = (FIXTURES / "mlp_inductor.cache").read_bytes()
    envelope, offset = decode_header(data)
    files = decode_payload(envelope.bundle, data, offset)
    header = msgspec.msgpack.decode(data[PREFIX_SIZE:offset])
    header["bundle"]["keys"]["cpu_flags"] = " ".join(sorted(bundle_keys.cpu_flags() or ()))
    blobs = [files[entry["path"]] for entry in header["bundle"]["files"]]
    eager_data = (FIXTURES / "mlp.cache").read_bytes()
    eager = msgspec.msgpack.decode(eager_data[PREFIX_SIZE : decode_header(eager_data)[1]])
    return {
        "mlp_inductor": Base("mlp_inductor", (FIXTURES / "mlp_inductor.py").read_bytes(), header, blobs),
        "mlp": Base("mlp", (FIXTURES / "mlp.py").read_bytes(), eager, []),
        "mlp+bundle": Base("mlp+bundle", (FIXTURES / "mlp.py").read_bytes(), {**eager, "bundle": header["bundle"]}, blobs),
    }


def compress(blob: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=3, write_content_size=True).compress(blob) if blob else b""


def rebundle(draft: Draft) -> None:
    """Make the bundle's sizes, hashes and payload agree with its files' contents again."""
    bundle, entries = draft.bundle, draft.entries
    if bundle is None or len(entries) != len(draft.blobs):
        return
    for entry, blob in zip(entries, draft.blobs):
        entry["size"], entry["sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    draft.payload = compress(b"".join(draft.blobs))
    bundle["payload_size"] = sum(map(len, draft.blobs))
    bundle["payload_compressed_size"] = len(draft.payload)
    bundle["payload_sha256"] = hashlib.sha256(draft.payload).hexdigest() if draft.payload else ""


def encode(draft: Draft) -> bytes:
    import msgspec

    header = draft.raw_header if draft.raw_header is not None else msgspec.msgpack.encode(draft.header)
    return MAGIC + len(header).to_bytes(4, "little") + header + draft.payload


def set_consistent(draft: Draft, payload: bytes, payload_size: int) -> None:
    """Store `payload` as the bundle's, its compressed size and sha256 recorded as they are."""
    draft.payload = payload
    bundle = draft.bundle
    if bundle is not None:
        bundle.update(payload_size=payload_size, payload_compressed_size=len(payload),
                      payload_sha256=hashlib.sha256(payload).hexdigest())


def pick_entry(rng: random.Random, draft: Draft) -> dict | None:
    return rng.choice(draft.entries) if draft.entries else None


def library_path(draft: Draft, kind: str) -> str | None:
    return next((entry["path"] for entry in draft.entries if entry.get("kind") == kind), None)


def planted_library(draft: Draft) -> Callable[[Sandbox], None]:
    """Puts a working copy of the bundle's kernel library in the canary dir: mapping it would be a foreign library loaded."""
    library = next((blob for entry, blob in zip(draft.entries, draft.blobs) if entry.get("kind") == "kernel"), b"")

    def plant(sandbox: Sandbox) -> None:
        (sandbox.canary / "evil.main.so").write_bytes(library)

    return plant


def plant_fifo(sandbox: Sandbox) -> None:
    (sandbox.inductor / "ff").mkdir()
    os.mkfifo(sandbox.inductor / "ff" / "cffifo.cpp")


def hostile_paths(sandbox: Sandbox) -> list[str]:
    target = f"{sandbox.canary}/written.main.so"
    return [
        target, f"triton/0/{target}", f"triton/0//{target}", f"triton/{target}", "triton/x", "triton/", "triton",
        "triton/0/../../canary/written", "../canary/written", "../../written", "qs/../../canary/written", "", ".", "./",
        "a//b.main.so", "./qs/x.so", "a/./b.cpp", "..\\..\\canary\\written", "\\abs\\written", "C:/written", "C:\\written",
        "c:written", "a\x00b.so", "x" * 300, "a/" * 2100 + "x", "ü/ünïcödé.main.so", "\u202e/os.niam.so", " /abs", "qs/ ",
        "locks/x.lock", "qs/x.py", "~/written", "$HOME/written", f"file://{target}", "triton/0/\x00",
    ]


# Structural mutations: they change what the bundle holds; sizes and hashes are recomputed after them.
def mutate_path(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    path = rng.choice(hostile_paths(sandbox))
    if rng.random() < 0.5 and draft.entries:
        pick_entry(rng, draft)["path"] = path
        return "bundle path renamed"
    if draft.bundle is None or len(draft.entries) != len(draft.blobs):
        return "bundle path (no bundle)"
    index = rng.randrange(len(draft.entries) + 1)
    draft.entries.insert(index, {"path": path, "kind": rng.choice(("kernel", "zz")), "size": 0, "sha256": ""})
    draft.blobs.insert(index, b"canary\n")
    return "bundle path added"


def mutate_kind(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    entry = pick_entry(rng, draft)
    if entry is not None:
        entry["kind"] = rng.choice(("fxgraph", "zz", "", "kernel", "triton", "isa-probe", "\x00", "k" * 10_000, 7, None))
    return "bundle kind"


def mutate_kernel_map(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    bundle = draft.bundle
    if bundle is None or not isinstance(bundle.get("kernels"), dict):
        return "kernel map (none)"
    kernels = bundle["kernels"]
    digest = next(iter(kernels), "0" * 64)
    choice = rng.randrange(6)
    if choice < 3:
        draft.plants.append(planted_library(draft))
        value = rng.choice((f"{sandbox.canary}/evil.main.so", "../canary/evil.main.so", "qs/../../canary/evil.main.so"))
    elif choice == 3:
        value = rng.choice((library_path(draft, "isa-probe"), library_path(draft, "kernel-source"), "zz/none.main.so", "", ".",
                            "a\x00b", str(Path(sys.base_prefix) / "lib"), "/proc/self/exe"))
    elif choice == 4:
        library = kernels.pop(digest, "")
        if rng.random() < 0.5:
            kernels[rng.choice(("", "x", "0" * 64))] = library
        return "kernel map keys"
    else:
        bundle["kernels"] = rng.choice(([], "x", {digest: 7}, {digest: None}))
        return "kernel map type"
    kernels[digest] = value
    return "kernel map value"


def mutate_keys(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    bundle = draft.bundle
    if bundle is None:
        return "keys (no bundle)"
    keys = bundle.setdefault("keys", {})
    choice = rng.randrange(5)
    if choice == 0 and keys:
        for name in rng.sample(sorted(keys), rng.randint(1, len(keys))):
            del keys[name]
        return "keys removed"
    if choice == 1:
        keys.clear()
        return "keys emptied"
    if choice == 2 and keys:
        keys[rng.choice(sorted(keys))] = rng.choice(("", "x", "2.13.0+cpu ", "\x00", "y" * 100_000))
        return "keys altered"
    if choice == 3:
        keys[rng.choice(("triton", "gpu_capability", "zz", ""))] = rng.choice(("", "9.0", "x"))
        return "keys added"
    bundle["keys"] = rng.choice(([], "x", {"torch": 1}, None))
    return "keys type"


def mutate_provenance(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    if draft.bundle is not None:
        draft.bundle["provenance"] = rng.choice((
            {}, {"torch_dir": str(sandbox.canary)}, {"x": "y" * 1_000_000}, {str(i): str(i) for i in range(10_000)},
            [], "x", {"a": 1}, {"a": None}, {"\x00": "\x00"},
        ))
    return "provenance"


def mutate_many_entries(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    """200k one-byte entries over 2,000 paths (200k files would cost minutes to write and remove here)."""
    if draft.bundle is None:
        return "200k entries (no bundle)"
    count = 200_000
    draft.bundle["files"] = [{"path": f"zz/{i % 2000:04d}.cpp", "kind": "isa-probe-source", "size": 0, "sha256": ""} for i in range(count)]
    draft.blobs = [b"x"] * count
    return "200k tiny entries"


def mutate_fifo_destination(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    """An empty bundle file whose destination in Inductor's cache dir is a FIFO (priming compares before writing)."""
    if draft.bundle is None:
        return "fifo destination (no bundle)"
    draft.entries.append({"path": "ff/cffifo.cpp", "kind": "isa-probe-source", "size": 0, "sha256": ""})
    draft.blobs.append(b"")
    draft.plants.append(plant_fifo)
    return "FIFO at a bundle destination"


def mutate_fifo_cache(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    draft.fifo = True
    return "cache is a FIFO"


# Lies: they run after sizes and hashes were made consistent, and contradict them.
def lie_sizes(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    bundle, entry = draft.bundle, pick_entry(rng, draft)
    if bundle is None or entry is None:
        return "sizes (no bundle)"
    choice = rng.randrange(5)
    if choice == 0:
        entry["size"] += rng.choice((-1, 1))
        bundle["payload_size"] = sum(e["size"] for e in draft.entries if isinstance(e.get("size"), int))
        return "entry size, sum kept"
    if choice == 1:
        entry["size"] = rng.choice((-1, 0, 2**63 - 1, 2**64 - 1, -(2**63), "1", 1.5, None))
        return "entry size"
    if choice == 2:
        entry["sha256"] = rng.choice(("", "0" * 64, entry["sha256"].upper(), "zz", entry["sha256"][:-1], 1))
        return "entry sha256"
    if choice == 3:
        bundle[rng.choice(("payload_size", "payload_compressed_size"))] = rng.choice((0, -1, 1, 2**62, 2**64 - 1, 8 * GIB + 1))
        return "payload size field"
    bundle["payload_sha256"] = rng.choice(("", "0" * 64, "x", None))
    return "payload sha256"


def lie_payload(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    """The payload itself damaged, its compressed size and sha256 recorded to match (so it gets decompressed)."""
    import zstandard

    blob = b"".join(draft.blobs)
    size = (draft.bundle or {}).get("payload_size", 0)
    choice = rng.randrange(6)
    if choice == 0:
        payload = draft.payload[: rng.randrange(max(1, len(draft.payload)))]
    elif choice == 1:
        payload = draft.payload + rng.choice((b"\x28\xb5\x2f\xfd", b"\x00" * 16, compress(b"extra")))
    elif choice == 2:
        payload = bytes(rng.randrange(256) for _ in range(rng.randint(1, 512)))
    elif choice == 3:  # a frame without its content size
        payload = zstandard.ZstdCompressor(write_content_size=False).compress(blob)
    elif choice == 4:  # a skippable frame first
        payload = b"\x50\x2a\x4d\x18" + (8).to_bytes(4, "little") + b"\x00" * 8 + draft.payload
    else:  # bytes flipped inside the frame
        data = bytearray(draft.payload)
        for _ in range(rng.randint(1, 8)):
            if data:
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        payload = bytes(data)
    set_consistent(draft, payload, size)
    return "payload damaged, hashes kept"


def zero_frame(size: int) -> bytes:
    """A zstd frame declaring and holding `size` zero bytes (about 32 KiB a GiB)."""
    import zstandard

    compressor = zstandard.ZstdCompressor(level=1).compressobj(size=size)
    chunk = bytes(16 * 1024 * 1024)
    parts = [compressor.compress(chunk[: min(len(chunk), size - done)]) for done in range(0, size, len(chunk))]
    return b"".join(parts) + compressor.flush()


_FRAMES: dict[int, bytes] = {}


def lie_bomb(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    """One bundle file of GiBs of zeros in a small frame, its index and hashes consistent up to the file's sha256."""
    bundle = draft.bundle
    if bundle is None:
        return "zstd bomb (no bundle)"
    size = rng.choice((3 * GIB, 3 * GIB // 2, GIB))
    declared = rng.choice((size, size, 64))
    if size not in _FRAMES:
        _FRAMES[size] = zero_frame(size)
    frame = _FRAMES[size]
    bundle["files"] = [{"path": "bo/cbomb.main.cpp", "kind": "kernel-source", "size": declared, "sha256": "0" * 64}]
    draft.blobs = []
    set_consistent(draft, frame, declared)
    return f"zstd bomb {size / GIB:g} GiB" + ("" if declared == size else " (64 bytes declared)")


def lie_format_version(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    if isinstance(draft.header, dict):
        draft.header["format_version"] = rng.choice((0, -1, 2, 99, 2**63 - 1, 2**64 - 1, -(2**63), "1", 1.0, None, True, [], {}))
    return "format_version"


def lie_fields(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    header = draft.header
    choice = rng.randrange(4)
    if choice == 0 and isinstance(header, dict):
        header.pop(rng.choice(("code_hash", "backend", "tracer", "producer", "bundle", "format_version")), None)
        return "envelope field removed"
    if choice == 1 and isinstance(header, dict):
        header[rng.choice(("code_hash", "backend", "tracer", "producer", "bundle"))] = rng.choice(("", "x", 1, None, [], {}, "inductor", "dynamo"))
        return "envelope field altered"
    if choice == 2 and isinstance(header, dict):
        header[rng.choice(("zz", "", "bundle2", "\x00"))] = rng.choice(("x", {"a": [1, 2]}, None))
        return "envelope field added"
    draft.header = rng.choice(([], 1, "x", None, {}, [header]))
    return "envelope not a map"


def lie_deep_msgpack(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    import msgspec

    depth = rng.choice((1_000, 100_000))
    nested = msgspec.Raw(b"\x91" * depth + b"\xc0")
    where = rng.choice(("extra field", "provenance", "keys", "kernels", "files", "format_version", "whole header"))
    bundle = draft.bundle
    if where == "whole header" or not isinstance(draft.header, dict):
        draft.header = nested
    elif where in ("provenance", "keys", "kernels") and bundle is not None:
        bundle[where] = {"deep": nested}
    elif where == "files" and bundle is not None:
        bundle["files"] = [nested]
    else:
        draft.header["format_version" if where == "format_version" else "deep"] = nested
    return f"msgpack nested {depth:,} deep ({where})"


def lie_header_bytes(rng: random.Random, draft: Draft, sandbox: Sandbox) -> str:
    import msgspec

    data = bytearray(msgspec.msgpack.encode(draft.header))
    for _ in range(rng.randint(1, 4)):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    draft.raw_header = bytes(data)
    return "header bytes flipped"


Mutation = Callable[[random.Random, Draft, Sandbox], str]
STRUCTURAL: tuple[Mutation, ...] = (mutate_path, mutate_path, mutate_kind, mutate_kernel_map, mutate_kernel_map, mutate_keys, mutate_provenance)
LIES: tuple[Mutation, ...] = (lie_sizes, lie_payload, lie_format_version, lie_fields, lie_deep_msgpack, lie_header_bytes)
LATE = frozenset((*LIES, lie_bomb))
"""The mutations that run after sizes and hashes were recomputed."""
RARE: tuple[tuple[int, int, Mutation, float], ...] = (
    # (period, offset, mutation, watchdog factor): too slow to draw often (a hang costs the watchdog,
    # a bomb GiBs, 200k entries a few seconds). Every slice of 150 cases
    # from 0 has each but the last (first at case 531)
    (250, 7, mutate_fifo_cache, 1), (250, 19, mutate_fifo_destination, 1), (100, 13, lie_bomb, 3), (1000, 531, mutate_many_entries, 3),
)


def rare_mutation(case: int) -> tuple[Mutation, float] | None:
    return next(((mutation, factor) for period, offset, mutation, factor in RARE if case % period == offset), None)


@dataclass(frozen=True)
class Case:
    number: int
    label: str
    python_code: bytes
    cache: bytes | None
    """None: the cache path is a FIFO."""
    plants: tuple[Callable[[Sandbox], None], ...]
    patience: float
    """The watchdog's factor: more than 1 for a case known to be slow when all goes well."""
    signing: str | None = None
    """How the pair is signed (bench/load_fuzz_signing.py: then loaded under pins), or None: unsigned, unpinned."""


def make_case(number: int, seed: str, bases: dict[str, Base], sandbox: Sandbox) -> Case:
    rng = random.Random(f"load-fuzz-{seed}-{number}")
    base = bases[rng.choices(("mlp_inductor", "mlp+bundle", "mlp"), weights=(8, 2, 1))[0]]
    draft = base.draft()
    rare = rare_mutation(number)
    patience = 1.0 if rare is None else rare[1]
    if rare is not None:
        chosen = [rare[0]]
    else:
        chosen = [rng.choice(STRUCTURAL + LIES)]
        if rng.random() < 0.3:
            chosen.append(rng.choice(STRUCTURAL + LIES))
    labels = [mutation(rng, draft, sandbox) for mutation in chosen if mutation not in LATE]
    rebundle(draft)
    labels += [mutation(rng, draft, sandbox) for mutation in chosen if mutation in LATE]
    signing = None if draft.fifo else signed.draw(seed, number)
    label = f"{base.name}: " + " + ".join(labels + ([signing] if signing else []))
    return Case(number, label, base.python_code, None if draft.fifo else encode(draft), tuple(draft.plants), patience, signing)


def lay_out(case: Case, sandbox: Sandbox, keys: signed.Keys) -> None:
    sandbox.create()
    sandbox.python_code.write_bytes(case.python_code)
    if case.cache is None:
        os.mkfifo(sandbox.cache)
    else:
        sandbox.cache.write_bytes(case.cache)
    if case.signing is not None:
        signed.sign_case(case.signing, sandbox.python_code, sandbox.cache, keys, case.number)
    for plant in case.plants:
        plant(sandbox)


# -- one case in a forked, sandboxed, memory-limited process -------------------------------------
JIT_REQUESTS: list[str] = []


def stand_in_for_jit() -> None:
    """Inductor's C++ compile costs seconds a kernel: a kernel the bundle does not serve resolves to a
    stub here, and is counted (the fuzz is of load, not of the compiler)."""
    from torch._inductor.async_compile import AsyncCompile

    def cpp_pybinding(self, argtypes, source_code):
        JIT_REQUESTS.append(hashlib.sha256(source_code.encode("utf-8")).hexdigest())
        return lambda *args: None

    AsyncCompile.cpp_pybinding = cpp_pybinding


def mapped_files() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split(None, 5)[5].strip().removesuffix(" (deleted)") for line in maps if len(line.split(None, 5)) == 6}


def allowed_mapping_roots(sandbox: Sandbox) -> tuple[str, ...]:
    import torch

    installs = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(Path(torch.__file__).parent.parent)}
    extracted = {str(sandbox.inductor), os.path.realpath(sandbox.inductor), str(sandbox.triton), os.path.realpath(sandbox.triton)}
    return tuple(sorted(installs | extracted | {"/usr", "/lib", "/lib64", "/etc", "/dev", "/proc", "/sys", "/run"}))


def foreign_mappings(before: set[str], after: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(path for path in after - before
                  if path.startswith("/") and not any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots))


def enter_sandbox(sandbox: Sandbox, memory_limit: int) -> None:
    os.setpgid(0, 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    os.environ.update(HOME=str(sandbox.home), TMPDIR=str(sandbox.tmp), TORCHINDUCTOR_CACHE_DIR=str(sandbox.inductor),
                      TRITON_CACHE_DIR=str(sandbox.triton))
    tempfile.tempdir = None
    os.chdir(sandbox.cwd)


def attempt_load(sandbox: Sandbox, pins: dict) -> dict:
    """Load the case's pair (with `pins`: load's trusted_keys, expect_name, min_release); say how it ended."""
    import precompile

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            precompile.load(sandbox.python_code, sandbox.cache, **pins)
        except precompile.PrecompileError as exc:
            return {"outcome": "PrecompileError", "detail": f"{type(exc).__name__}: {str(exc)[:300]}"}
        except MemoryError:
            return {"outcome": "memory", "detail": "MemoryError", "finding": "MemoryError"}
        except BaseException as exc:  # noqa: BLE001 - what escapes load is the figure
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return {"outcome": "raw exception", "detail": f"{type(exc).__name__}: {str(exc)[:300]}",
                    "finding": f"{type(exc).__name__} at {Path(where.filename).name}:{where.lineno}"}
    warned = [str(w.message)[:300] for w in caught if issubclass(w.category, precompile.PrecompileWarning)]
    if warned:
        return {"outcome": "degraded with a PrecompileWarning", "detail": warned[0]}
    if JIT_REQUESTS:
        return {"outcome": "served, compiling its kernels without a warning", "detail": f"{len(JIT_REQUESTS)} kernels"}
    return {"outcome": "served", "detail": ""}


def serve_case(sandbox: Sandbox, memory_limit: int, roots: tuple[str, ...], pins: dict) -> dict:
    """In the forked process: load the case's pair in its sandbox; the report includes the libraries it mapped."""
    enter_sandbox(sandbox, memory_limit)
    before = mapped_files()
    report = attempt_load(sandbox, pins)
    report["foreign"] = foreign_mappings(before, mapped_files(), roots)
    return report


def read_report(fd: int, deadline: float) -> bytes | None:
    """All the forked process writes to `fd` before it closes it; None if the deadline passes first."""
    chunks = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def run_forked(sandbox: Sandbox, memory_limit: int, watchdog_s: float, pins: dict) -> dict:
    roots = allowed_mapping_roots(sandbox)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked case
        os.close(read_end)
        try:
            os.write(write_end, json.dumps(serve_case(sandbox, memory_limit, roots, pins)).encode())
        except MemoryError:
            os.write(write_end, b'{"outcome": "memory", "detail": "MemoryError while reporting", "finding": "MemoryError", "foreign": []}')
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        data = read_report(read_end, time.monotonic() + watchdog_s)
    finally:
        os.close(read_end)
    if data is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"outcome": "hang", "detail": f"no answer within {watchdog_s:.0f} s", "finding": "no answer", "foreign": []}
    _, status = os.waitpid(pid, 0)
    if not data:
        died = f"died: {describe_status(status)}"
        return {"outcome": "memory", "detail": died, "finding": died, "foreign": []}
    return json.loads(data)


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exit {os.WEXITSTATUS(status)}"


def address_space() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmSize:"))
    return int(line.split()[1]) * 1024


def keep_failure(case: Case, sandbox: Sandbox, result: dict, failures: Path) -> None:
    keep = failures / f"load-case-{case.number}"
    shutil.rmtree(keep, ignore_errors=True)
    keep.mkdir(parents=True)
    shutil.copy(sandbox.python_code, keep / "f.py")
    if case.cache is not None:
        (keep / "f.cache").write_bytes(case.cache)
    if sandbox.python_code.with_suffix(".sig").is_file():
        shutil.copy(sandbox.python_code.with_suffix(".sig"), keep / "f.sig")
    (keep / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def failed(result: dict) -> bool:
    return result["outcome"] in MUST_BE_ZERO or bool(result["outside"]) or bool(result["foreign"]) or result["against_pins"]


def run_case(number: int, seed: str, bases: dict[str, Base], work: Path, failures: Path, memory_limit: int,
             watchdog_s: float, keys: signed.Keys) -> dict:
    sandbox = Sandbox(work / f"case-{number}" / "box")
    case = make_case(number, seed, bases, sandbox)
    lay_out(case, sandbox, keys)
    before = snapshot(sandbox.case_dir)
    started = time.perf_counter()
    result = run_forked(sandbox, memory_limit, watchdog_s * case.patience, keys.pins() if case.signing else {})
    result.update(case=number, label=case.label, seconds=round(time.perf_counter() - started, 3), signing=case.signing,
                  outside=writes_outside_roots(sandbox, before, snapshot(sandbox.case_dir)),
                  against_pins=signed.against_pins(case.signing, result["outcome"]))
    if failed(result):
        keep_failure(case, sandbox, result, failures)
    shutil.rmtree(sandbox.case_dir, ignore_errors=True)
    return result


def serve_cases(cases: Iterable[int], seed: str, work: Path, failures: Path, watchdog_s: float) -> None:
    """The long-lived process: import torch and precompile once, then fork a process per case; one JSON line each."""
    import torch  # noqa: F401 - imported once, before the forks

    import precompile  # noqa: F401

    logging_quiet()
    stand_in_for_jit()
    bases = load_bases()
    keys = signed.make_keys(work / "keys")
    memory_limit = address_space() + MEMORY_HEADROOM
    for number in cases:
        print(json.dumps(run_case(number, seed, bases, work, failures, memory_limit, watchdog_s, keys)), flush=True)


def logging_quiet() -> None:
    import logging

    logging.getLogger("precompile").setLevel(logging.CRITICAL)
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


# -- driving it ----------------------------------------------------------------------------------
def job_of(case: int, jobs: int) -> int:
    """Which of `jobs` processes runs a case: spread by a hash, as the rare (slow) cases are periodic."""
    return zlib.crc32(str(case).encode()) % jobs


def cases_text(cases: Iterable[int]) -> str:
    """`cases` as --cases takes them: START:STOP for each run of consecutive numbers, comma-separated."""
    runs: list[list[int]] = []
    for case in sorted(cases):
        if runs and case == runs[-1][1]:
            runs[-1][1] = case + 1
        else:
            runs.append([case, case + 1])
    return ",".join(f"{start}:{stop}" for start, stop in runs)


def parse_cases(text: str) -> list[int]:
    return [case for part in text.split(",") if part for case in range(*(int(n) for n in part.split(":")))]


def fuzz(cases: Iterable[int], *, seed: str = "0", jobs: int = 1, failures: Path, watchdog_s: float = WATCHDOG_S) -> list[dict]:
    """Run `cases` in `jobs` long-lived processes (see job_of); one result per case."""
    with tempfile.TemporaryDirectory(prefix="precompile-load-fuzz-") as tmp:
        processes = [
            subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--cases", cases_text(cases), "--job", f"{job}/{jobs}", "--seed", seed,
                 "--work", str(Path(tmp) / f"job-{job}"), "--failures", str(failures), "--watchdog", str(watchdog_s)],
                stdout=subprocess.PIPE, text=True, cwd=tmp, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
            )
            for job in range(jobs)
        ]
        results = []
        for process in processes:
            out, _ = process.communicate()
            results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            if process.returncode != 0:
                raise RuntimeError(f"a load fuzz process exited {process.returncode} after {len(results)} cases")
    return sorted(results, key=lambda result: result["case"])


def figures(results: list[dict]) -> dict[str, int]:
    counts = Counter(result["outcome"] for result in results)
    return {
        "cases": len(results), **{outcome: counts[outcome] for outcome in OUTCOMES},
        "writes outside the cache roots": sum(1 for result in results if result["outside"]),
        "foreign libraries": sum(1 for result in results if result["foreign"]),
        "signed cases, loaded under pins": sum(1 for result in results if result["signing"]),
        "refused by their pins (PrecompileError)": sum(1 for result in results if result["signing"] and not signed.SCHEMES[result["signing"]]
                                                        and result["outcome"] == "PrecompileError"),
        "served against its pins": sum(1 for result in results if result["against_pins"]),
    }


def finding_names(result: dict) -> list[str]:
    """What a case found, named so that cases finding the same thing share a name (case numbers and
    process ids in paths made N)."""
    names = [f"{result['outcome']}: {result['finding']}"] if result["outcome"] in MUST_BE_ZERO else []
    names += sorted({f"wrote {re.sub(r'[0-9]+', 'N', path)}" for path in result["outside"]})
    names += sorted({f"mapped {re.sub(r'^.*/case-[0-9]+/', '', path)}" for path in result["foreign"]})
    names += [f"served against its pins: {result['signing']} ({result['outcome']})"] if result["against_pins"] else []
    return names


def findings(results: list[dict]) -> dict[str, list[dict]]:
    """{finding: the cases that found it}, most found first."""
    found: dict[str, list[dict]] = {}
    for result in results:
        for name in finding_names(result):
            found.setdefault(name, []).append(result)
    return dict(sorted(found.items(), key=lambda item: -len(item[1])))


def main() -> int:
    parser = argparse.ArgumentParser(description="the long-lived process of the load fuzz (see bench/stress.py --parts load)")
    parser.add_argument("--cases", required=True, help="START:STOP[,START:STOP...]")
    parser.add_argument("--job", default="0/1", help="JOB/JOBS: run the cases job_of gives JOB of JOBS processes")
    parser.add_argument("--seed", default="0")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--failures", type=Path, required=True)
    parser.add_argument("--watchdog", type=float, default=WATCHDOG_S)
    args = parser.parse_args()
    job, jobs = (int(part) for part in args.job.split("/"))
    args.work.mkdir(parents=True, exist_ok=True)
    cases = [case for case in parse_cases(args.cases) if job_of(case, jobs) == job]
    serve_cases(cases, args.seed, args.work, args.failures, args.watchdog)
    return 0


if __name__ == "__main__":
    sys.exit(main())
