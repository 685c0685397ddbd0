"""Part 6 of bench/stress.py: a co-tenant's libraries against load's JIT path (issue 52, finding 1).

A second local user (uid 65534: a forked child of this root process drops to it) takes Inductor's
default root `$TMPDIR/torchinductor_root` first, or writes into it, and plants a library at every
path a kernel or ISA probe will have there: the paths the pair's own bundle names, and those a
rehearsal of a compile after load (`torch.compile`, in a private root of its own) learns. The
library's constructor appends a line to a marker file, so every process that maps one, ISA probes
included, is counted. Each case loads the mlp_inductor fixture in a fresh process with TMPDIR a
root-owned sticky directory, as /tmp is: python_code alone (JIT), a signed pair whose bundle records
another machine (JIT unpinned, refused pinned), a signed pair whose bundle fits (served), and a
compile after load returns. Foreign libraries mapped must be 0; each case must end as the rule of
docs/trust.md ("JIT compiles") says.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "v1" / "mlp_inductor"
CO_TENANT = 65534
MUST_BE_ZERO = ("foreign libraries mapped", "cases not ending as the rule says")

CONSTRUCTOR = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { write(fd, "mapped\n", 7); close(fd); }
}
"""

COMPILE_AFTER = "import torch\ntorch.compile(lambda x: (x * 3 - 1).relu(), backend='inductor')(torch.ones(8))\n"

CHILD = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
artifact, cache, compile_after, keys = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4:]
result = {}
if artifact:
    import precompile
    try:
        precompile.load(artifact, cache, trusted_keys=keys or None)
        result["outcome"] = "served"
    except precompile.PrecompileError as exc:
        result["outcome"] = "refused"
if compile_after:
    exec(COMPILE_AFTER)
result["root"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
print(json.dumps(result))
""".replace("COMPILE_AFTER", repr(COMPILE_AFTER))

# (name, pair, root taken how, pinned, compile after load, the outcome the rule says)
CASES = (
    ("python_code alone; root another user's, mode 0777", "alone", "foreign", False, False, "served"),
    ("python_code alone; root this user's, mode 0777", "alone", "world-writable", False, False, "served"),
    ("python_code alone; root a co-tenant's symlink to their dir", "alone", "symlink", False, False, "served"),
    ("python_code alone; TORCHINDUCTOR_CACHE_DIR private, default taken", "alone", "default only", False, False, "served"),
    ("signed, bundle for another machine, unpinned; root another user's", "other machine", "foreign", False, False, "served"),
    ("signed, bundle for another machine, pinned; root another user's", "other machine", "foreign", True, False, "refused"),
    ("signed, bundle fits, pinned; torch.compile after load", "fits", "foreign", True, True, "served"),
)


def _sh(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)


def _as_co_tenant(action) -> None:
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.setgroups([])
            os.setgid(CO_TENANT)
            os.setuid(CO_TENANT)
            os.umask(0)
            action()
            status = 0
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("the co-tenant could not plant its libraries")


def _pairs(work: Path) -> tuple[dict[str, tuple[Path, Path]], Path, list[str]]:
    """The pairs the cases load, the public key that signed them, and the bundle's library paths."""
    import torch  # noqa: F401  (its build keys are among the host's)

    from precompile.artifact import codec
    from precompile.artifact.bundle_keys import host_keys
    from precompile.artifact.codec import decode_payload
    from precompile.artifact.pair import parse_cache
    from precompile.signing import generate, sign_pair

    parsed = parse_cache(FIXTURE.with_suffix(".cache"), FIXTURE.with_suffix(".cache").read_bytes())
    bundle = parsed.envelope.bundle
    files = decode_payload(bundle, parsed.data, parsed.payload_offset)
    kinds = {entry.path: entry.kind for entry in bundle.files}
    private_key, public_key, _ = generate(work / "release")
    pairs = {"alone": (FIXTURE.with_suffix(".py"), work / "missing.cache")}
    for name, changed in (("fits", {}), ("other machine", {"machine": "riscv64"})):
        directory = work / name.replace(" ", "-")
        directory.mkdir()
        artifact, cache = directory / "model.py", directory / "model.cache"
        shutil.copy(FIXTURE.with_suffix(".py"), artifact)
        # sealed as capture seals it now: the requirements the fixture predates recorded as this host's
        host = host_keys()
        flags = {"cpu_flags": host["cpu_flags"]} if "cpu_flags" in host else {}  # this CPU's, not the fixture's AMD one's
        keys = {**host, "valid_isas": "avx512", **bundle.keys, **flags, **changed}
        rebuilt, payload = codec.build_bundle({path: (kinds[path], data) for path, data in files.items()}, keys,
                                              dict(bundle.kernels))
        cache.write_bytes(codec.encode_cache(msgspec.structs.replace(parsed.envelope, bundle=rebuilt), payload))
        sign_pair(artifact, cache, private_key)
        pairs[name] = (artifact, cache)
    return pairs, public_key, [path for path in kinds if path.endswith(".so")]


def _child(tmp: Path, extra: dict[str, str], *args: str) -> dict:
    env = {name: value for name, value in os.environ.items() if name not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")}
    env.update({"TMPDIR": str(tmp), "PYTHONPATH": str(ROOT), **extra})
    proc = _sh([sys.executable, "-c", CHILD, *args], env=env, timeout=900)
    if proc.returncode != 0:
        return {"outcome": f"crashed ({proc.returncode})"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _rehearsed(work: Path) -> list[str]:
    """The library paths a compile after load has, learned as a co-tenant would: by compiling the same
    code on the same software in a root of one's own."""
    rehearsal = work / "rehearsal"
    _child(work, {"TORCHINDUCTOR_CACHE_DIR": str(rehearsal)}, "", "", "1")
    return sorted(str(path.relative_to(rehearsal)) for path in rehearsal.rglob("*.so"))


def _take(tmp: Path, how: str, library: Path, paths: list[str], work: Path) -> dict[str, str]:
    """The co-tenant takes the default root (or writes into this user's) and plants `paths` there;
    the environment the case loads in."""
    root, theirs = tmp / "torchinductor_root", tmp / "theirs"
    extra = {}
    if how == "world-writable":
        root.mkdir(mode=0o777)
        os.chmod(root, 0o777)
    if how == "default only":
        extra["TORCHINDUCTOR_CACHE_DIR"] = str(work / "mine")

    def plant() -> None:
        target = theirs if how == "symlink" else root
        target.mkdir(mode=0o777, exist_ok=True)
        if how == "symlink":
            root.symlink_to(theirs)
        for relative in paths:
            (target / relative).parent.mkdir(mode=0o777, parents=True, exist_ok=True)
            shutil.copyfile(library, target / relative)
            os.chmod(target / relative, 0o755)

    _as_co_tenant(plant)
    return extra


def run() -> dict:
    """Every case once; the figures, one row per case, and why the part was skipped (None if it ran)."""
    if os.getuid() != 0:
        return {"skipped": "emulating a second user needs root (to drop a forked child to uid 65534)"}
    if shutil.which("cc") is None:
        return {"skipped": "no C compiler (cc) to build the planted library with"}
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="precompile-cotenant-"))  # outside dirs only root may enter
    os.chmod(work, 0o755)
    try:
        marker, source, library = work / "mapped.txt", work / "planted.c", work / "planted.so"
        source.write_text(CONSTRUCTOR)
        _sh(["cc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(library), str(source)]).check_returncode()
        os.chmod(library, 0o755)
        pairs, public_key, bundled = _pairs(work)
        after = _rehearsed(work)
        rows, mapped_total, wrong = [], 0, 0
        for number, (name, pair, how, pinned, compile_after, expected) in enumerate(CASES):
            tmp = work / f"tmp{number}"
            tmp.mkdir()
            os.chmod(tmp, 0o1777)
            extra = _take(tmp, how, library, bundled + (after if compile_after else []), work)
            marker.unlink(missing_ok=True)
            artifact, cache = pairs[pair]
            result = _child(tmp, extra, str(artifact), str(cache), "1" if compile_after else "0",
                            *([str(public_key)] if pinned else []))
            mapped = len(marker.read_text().splitlines()) if marker.exists() else 0
            mapped_total += mapped
            wrong += result["outcome"] != expected
            rows.append((name, expected, result["outcome"], mapped))
        figures = {"cases": len(CASES), "libraries planted per case (bundle's; + rehearsed compile)":
                   f"{len(bundled)}; +{len(after)}", "foreign libraries mapped": mapped_total,
                   "cases not ending as the rule says": wrong}
        return {"figures": figures, "rows": rows, "seconds": time.perf_counter() - started, "skipped": None}
    finally:
        shutil.rmtree(work, ignore_errors=True)
