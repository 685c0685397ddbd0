"""What a kernel bundle may hold and where `load` may put it: one rule, applied when a cache is decoded.

Capture bundles only kernel files, named as Inductor and Triton name them in their cache dirs. A
bundle entry is therefore accepted only when:

- its path is a relative POSIX path of plain parts (no empty, `.` or `..` part, no backslash, NUL,
  drive or control character, each part at most 255 bytes);
- its kind is the one capture gives a file of that name (`kind_of`), so a `.py`, a lock or an
  Inductor `fxgraph` entry cannot ride in under a kernel's kind;
- for Triton files, the path is `triton/<device number>/<file...>`;
- the bundle holds at most MAX_FILES entries, each path once;
- every value of the kernel map names a bundle entry of kind "kernel", keyed by a sha256.

`destination` maps an accepted entry into the root its kind belongs to (Inductor's cache dir, or the
dir Triton reads), and refuses a target that resolves (through a symlink already on disk, say)
outside that root. Torch-free: show, verify and extract apply the same rule as load.

Whether `load` serves a well-formed bundle at all is `unserved_reason`: only a bundle whose header
is sealed by its digest and which records every requirement capture records, so that deleting a
requirement cannot switch off the host check (the check fails closed).
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from precompile.artifact import bundle_keys
from precompile.artifact.envelope import BundleFile, CacheEnvelope, KernelBundle

MAX_FILES = 20_000
MAX_PART_BYTES = 255
MAX_PATH_BYTES = 1024

# Bundle file kinds, by how the file is named in Inductor's cache dir; the first match names it.
_KINDS = (
    (re.compile(r"^[^/]+/[^/]+\.main\.so$"), "kernel"),
    (re.compile(r"^[^/]+/[^/]+\.main\.cpp$"), "kernel-source"),
    (re.compile(r"^[^/]+/[^/]+\.so$"), "isa-probe"),
    (re.compile(r"^[^/]+/[^/]+\.cpp$"), "isa-probe-source"),
    (re.compile(r"^[^/]+/[^/]+\.best_config$"), "autotune-result"),
    (re.compile(r"^triton/[0-9]+/[^/]+(/[^/]+)*$"), "triton"),
)
KINDS = tuple(kind for _, kind in _KINDS)
TRITON_PREFIX = "triton/"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_FORBIDDEN_CHARACTER = re.compile(r"[\x00-\x1f\x7f\\:]")


def kind_of(path: str) -> str | None:
    """The kind capture gives a file at `path` of its private cache dir, or None if it bundles no such file.
    Under `triton/` only Triton's own files live (Triton's cache dir is served from there)."""
    if path.startswith("locks/") or path.endswith((".lock", ".py")):
        return None
    if path.startswith(TRITON_PREFIX):
        return "triton" if _KINDS[-1][0].search(path) else None
    for pattern, kind in _KINDS:
        if pattern.search(path):
            return kind
    return None


def path_problem(path: str) -> str | None:
    """Why `path` is not a plain relative POSIX path inside a bundle root, or None."""
    if not path:
        return "it is empty"
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        return f"it is longer than {MAX_PATH_BYTES} bytes"
    found = _FORBIDDEN_CHARACTER.search(path)
    if found:
        return f"it holds the character {found.group()!r} (no backslash, colon, NUL or control character is allowed)"
    if path.startswith("/"):
        return "it is absolute"
    for part in path.split("/"):
        if part in (".", ".."):
            return f"it has a {part!r} part"
        if not part:
            return "it has an empty part (a doubled or trailing '/')"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_PART_BYTES:
            return f"its part {part[:32]!r}... is longer than {MAX_PART_BYTES} bytes"
    return None


def _entry_problem(entry: BundleFile) -> str | None:
    """Why one bundle entry, taken alone, breaks the rule (its path, kind or size), or None."""
    problem = path_problem(entry.path)
    if problem is not None:
        return f"bundle entry {entry.path!r} is refused: {problem}"
    expected = kind_of(entry.path)
    if expected is None:
        return f"bundle entry {entry.path!r} is not a file capture bundles (it declares kind {entry.kind!r})"
    if entry.kind != expected:
        return f"bundle entry {entry.path!r} declares kind {entry.kind!r}, but capture gives such a file kind {expected!r}"
    if entry.size < 0:
        return f"bundle entry {entry.path!r} declares a negative size {entry.size}"
    return None


def _kernel_map_problem(kernels: dict[str, str], kinds: dict[str, str]) -> str | None:
    """Why the kernel map (`kinds`: each bundle path's kind) breaks the rule, or None."""
    for digest, library in kernels.items():
        if not _SHA256.match(digest):
            return f"kernel map key {digest!r} is not the sha256 of a kernel source"
        if kinds.get(library) != "kernel":
            shown = "is not in the bundle" if library not in kinds else f"is a bundle file of kind {kinds[library]!r}"
            return f"kernel map value {library!r} (for source {digest[:12]}...) {shown}; it must name a bundled kernel library"
    return None


def bundle_problem(bundle: KernelBundle) -> str | None:
    """Why the bundle index breaks the rule above, or None. The message names the entry."""
    if len(bundle.files) > MAX_FILES:
        return f"it lists {len(bundle.files)} files, over the {MAX_FILES}-file limit for a kernel bundle"
    seen: dict[str, str] = {}
    targets: dict[str, str] = {}
    libraries: dict[str, str] = {}
    for entry in bundle.files:
        problem = _entry_problem(entry)
        if problem is not None:
            return problem
        if entry.path in seen:
            return f"bundle entry {entry.path!r} is listed twice"
        seen[entry.path] = entry.kind
        target = _rooted(entry.path)
        if target in targets:  # Triton's device number is not part of where load writes
            return f"bundle entries {targets[target]!r} and {entry.path!r} would be written to the same file"
        targets[target] = entry.path
        if entry.kind == "kernel":  # a kernel library is loaded as the module <stem>.kernel
            stem = entry.path.rsplit("/", 1)[-1].split(".", 1)[0]
            if stem in libraries:
                return f"bundle kernels {libraries[stem]!r} and {entry.path!r} share the module name {stem!r}"
            libraries[stem] = entry.path
    return _directory_problem(targets) or _kernel_map_problem(bundle.kernels, seen)


def _directory_problem(targets: dict[str, str]) -> str | None:
    """An entry written where another needs a directory (`a/k.json` and `a/k.json/x`): load would
    write some of the bundle and fail on the rest (found by a hostile review)."""
    for target, path in targets.items():
        root, _, rest = target.partition(":")
        parts = rest.split("/")
        for depth in range(1, len(parts)):
            holder = targets.get(f"{root}:{'/'.join(parts[:depth])}")
            if holder is not None:
                return f"bundle entry {holder!r} is a file where {path!r} needs a directory"
    return None


def _rooted(path: str) -> str:
    """Where an entry lands, relative to the roots: a Triton file without its `triton/<device>/`."""
    if path.startswith(TRITON_PREFIX):
        return "triton:" + "/".join(path.split("/")[2:])
    return "inductor:" + path


def destination(path: str, inductor_root: Path, triton_root: Path) -> Path:
    """Where an accepted bundle entry goes: Triton's files into `triton_root` (without their
    `triton/<device>/` prefix), the rest into `inductor_root`. Raises ValueError when the target,
    resolved, would lie outside that root."""
    problem = path_problem(path)
    if problem is not None:
        raise ValueError(f"bundle entry {path!r} is refused: {problem}")
    if path.startswith(TRITON_PREFIX):
        parts = path.split("/")
        if len(parts) < 3 or not parts[1].isdigit():
            raise ValueError(f"bundle entry {path!r} is refused: a Triton file is named triton/<device>/<file>")
        root, relative = triton_root, "/".join(parts[2:])
    else:
        root, relative = inductor_root, path
    target = root.joinpath(*relative.split("/"))
    resolved_root = os.path.realpath(root)
    if not os.path.realpath(target).startswith(resolved_root + os.sep):
        raise ValueError(f"bundle entry {path!r} resolves to {os.path.realpath(target)}, outside {resolved_root}")
    return target


def unserved_reason(envelope: CacheEnvelope) -> str | None:
    """Why `load` would not serve this envelope's kernels on any host (it compiles them instead), or
    None. Whether they fit this host is bundle_keys.mismatches."""
    bundle = envelope.bundle
    if bundle is None or not bundle.files:
        return None
    if not envelope.header_sha256:
        return ("its header has no header_sha256 (an earlier precompile wrote it), so nothing shows that its kernel "
                "map and requirements are the ones captured")
    gpu = any(entry.kind == "triton" for entry in bundle.files)
    missing = bundle_keys.missing_requirements(bundle.keys, gpu=gpu)
    if missing:
        return f"it lacks requirements every capture records: {', '.join(missing)}; a host check cannot be made without them"
    return None
