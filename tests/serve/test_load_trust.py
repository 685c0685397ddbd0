"""A cache is an acceleration, never a door: what `load` does with a kernel bundle is decided by one
rule applied when the cache is decoded, so show, verify, extract and load all refuse the same caches,
and load never writes outside Inductor's and Triton's cache roots, never loads a library the bundle
does not hold, and never ends in a raw exception.

Each hostile cache below is hand-made as an attacker would make it: the header's hashes recomputed
so that every integrity check short of the rules passes. The pair is an eager fixture whose
python_code needs no kernel, so a refused bundle still serves (JIT has nothing to compile).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import warnings
from pathlib import Path

import msgspec
import pytest
import zstandard

import precompile
from precompile.cli.main import main
from precompile.artifact import bundle_keys
from precompile.artifact import codec
from precompile.artifact.pair import parse_cache, pending_path

FIXTURES = Path(__file__).resolve().parent.parent.parent / "fixtures" / "v1"
KERNEL = "ab/cabc.main.so"
SOURCE_SHA = "a" * 64


def _keys() -> dict[str, str]:
    """This host's requirements, as a capture here records them (torch imported: its build keys too)."""
    import torch  # noqa: F401

    return {**bundle_keys.host_keys(), "isa": "VecAVX2", "valid_isas": "VecAVX2"}


def _pair(tmp_path: Path, files: dict[str, tuple[str, bytes]], *, keys=None, kernels=None, name="m") -> tuple[Path, Path]:
    """The eager mlp fixture's python_code with a cache holding `files` as its bundle, sealed as capture seals it."""
    artifact, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    shutil.copy(FIXTURES / "mlp.py", artifact)
    envelope = parse_cache(cache, (FIXTURES / "mlp.cache").read_bytes()).envelope
    bundle, payload = codec.build_bundle(files, _keys() if keys is None else keys, kernels)
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, bundle=bundle), payload))
    return artifact, cache


def _forge(cache: Path, bundle: dict | None = None, **fields_changed) -> None:
    """Rewrite the cache's header as a hand edit would, with every hash recomputed (header digest included)."""
    data = cache.read_bytes()
    offset = codec.PREFIX_SIZE + int.from_bytes(data[len(codec.MAGIC) : codec.PREFIX_SIZE], "little")
    fields = msgspec.msgpack.decode(data[codec.PREFIX_SIZE : offset])
    fields.update(fields_changed)
    fields["bundle"].update(bundle or {})
    fields.pop("header_sha256")
    fields["header_sha256"] = codec.header_digest(msgspec.msgpack.encode(fields))
    header = msgspec.msgpack.encode(fields)
    cache.write_bytes(codec.MAGIC + len(header).to_bytes(4, "little") + header + data[offset:])


@pytest.fixture
def roots(tmp_path, monkeypatch):
    """Inductor's cache dir for this test (Triton's lies inside it), and a canary dir outside both."""
    inductor = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(inductor))
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    canary = tmp_path / "canary"
    canary.mkdir()
    return inductor, canary


def _load_warns(artifact: Path, cache: Path, match: str, *, cache_used: bool = False):
    """Load serves python_code alone (cache refused) or with the cache but not its kernels (cache_used)."""
    with pytest.warns(precompile.PrecompileWarning, match=match):
        runnable = precompile.load(artifact, cache)
    assert runnable.cache_used == cache_used
    return runnable


def _cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


# -- finding 1: a Triton entry whose third part is absolute wrote anywhere ---------------------------
def test_a_triton_entry_naming_an_absolute_path_is_refused_by_every_verb_and_load_writes_nothing(tmp_path, roots, capsys):
    inductor, canary = roots
    target = canary / "pwned.pth"
    artifact, cache = _pair(tmp_path, {"triton/0/abc/k.cubin": ("triton", b"x" * 16)})
    _forge(cache, bundle=dict(files=[{"path": f"triton/0/{target}", "kind": "triton", "size": 16,
                          "sha256": hashlib.sha256(b"x" * 16).hexdigest()}]))
    _load_warns(artifact, cache, r"bundle entry 'triton/0//.*pwned\.pth' is refused: it has an empty part")
    assert not target.exists() and _written(inductor) == []
    for verb in ("show", "verify"):
        rc, out = _cli(capsys, verb, str(artifact), str(cache))
        assert rc != 0 and "is refused: it has an empty part" in out, (verb, out)
    rc, out = _cli(capsys, "extract", str(artifact), str(cache), str(tmp_path / "out"))
    assert rc == 2 and not target.exists()


def test_a_triton_entry_without_a_device_part_degrades_instead_of_an_index_error(tmp_path, roots):
    artifact, cache = _pair(tmp_path, {"triton/0/abc/k.cubin": ("triton", b"x" * 16)})
    _forge(cache, bundle=dict(files=[{"path": "triton/x", "kind": "triton", "size": 16, "sha256": hashlib.sha256(b"x" * 16).hexdigest()}]))
    _load_warns(artifact, cache, r"bundle entry 'triton/x' is not a file capture bundles")


@pytest.mark.parametrize("path", ["/etc/k.main.so", "ab/../../k.main.so", "ab/./k.main.so", "ab\\k.main.so",
                                  "c:/k.main.so", "ab/k\x00.main.so", "ab//k.main.so"])
def test_bundle_paths_that_are_not_plain_relative_parts_are_refused_at_decode(tmp_path, path):
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")})
    _forge(cache, bundle=dict(files=[{"path": path, "kind": "kernel", "size": 4, "sha256": hashlib.sha256(b"\x7fELF").hexdigest()}]))
    parsed = parse_cache(cache, cache.read_bytes())
    assert parsed.envelope is None and f"bundle entry {path!r}" in parsed.problem


# -- finding 2: a kernel map value outside the bundle was dlopened ----------------------------------
def test_a_kernel_map_naming_a_library_outside_the_bundle_is_refused(tmp_path, roots, capsys):
    _, canary = roots
    outside = canary / "evil.so"
    outside.write_bytes(b"\x7fELF")
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")}, kernels={SOURCE_SHA: KERNEL})
    _forge(cache, bundle=dict(kernels={SOURCE_SHA: str(outside)}))
    _load_warns(artifact, cache, r"kernel map value '.*evil\.so' \(for source aaaaaaaaaaaa\.\.\.\) is not in the bundle")
    rc, out = _cli(capsys, "verify", "-v", str(artifact), str(cache))
    assert rc == 2 and "it must name a bundled kernel library" in out  # a cache that breaks a bundle rule is refused: trouble, as show says


def test_a_kernel_map_naming_a_bundle_file_that_is_not_a_kernel_is_refused(tmp_path):
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF"), "ab/cabc.main.cpp": ("kernel-source", b"int k;")},
                            kernels={SOURCE_SHA: "ab/cabc.main.cpp"})
    assert "is a bundle file of kind 'kernel-source'" in parse_cache(cache, cache.read_bytes()).problem


# -- finding 3: deleting the requirements switched the host check off ------------------------------
def test_a_bundle_without_its_requirements_is_not_served_and_verify_host_names_what_is_missing(tmp_path, roots, capsys):
    inductor, _ = roots
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")}, keys={})
    _load_warns(artifact, cache, r"not serving the kernel bundle .*lacks requirements every capture records: torch, torch_git",
                cache_used=True)
    assert _written(inductor) == []
    rc, out = _cli(capsys, "verify", "-v", "--host", str(artifact), str(cache))
    assert rc == 1
    assert "FAIL  host kernels requirement torch: the bundle does not record torch" in out
    assert "the kernel bundle fits this host" not in out


def test_a_gpu_bundle_without_the_gpu_requirements_is_not_served(tmp_path, roots):
    artifact, cache = _pair(tmp_path, {"triton/0/abc/k.cubin": ("triton", b"x" * 16)})
    _load_warns(artifact, cache, r"lacks requirements every capture records: gpu_capability, triton, triton_key, triton_env",
                cache_used=True)


# -- finding 4: entries of any kind were planted in Inductor's cache dir ----------------------------
@pytest.mark.parametrize(("path", "kind"), [("fxgraph/ab/fab", "fxgraph"), ("zz/evil.py", "kernel"), ("ab/k.main.so", "fxgraph"),
                                             ("locks/ab.lock", "kernel"), ("ab/cabc.main.so", "kernel-source")])
def test_only_files_of_the_kinds_capture_bundles_are_accepted(tmp_path, roots, path, kind):
    inductor, _ = roots
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")})
    _forge(cache, bundle=dict(files=[{"path": path, "kind": kind, "size": 4, "sha256": hashlib.sha256(b"\x7fELF").hexdigest()}]))
    _load_warns(artifact, cache, rf"bundle entry '{path}'")
    assert _written(inductor) == []


# -- finding 5: header fields were covered by no hash -----------------------------------------------
@pytest.mark.parametrize("field", ["keys", "kind", "provenance", "size"])
def test_a_changed_header_field_fails_verify_and_is_ignored_by_load(tmp_path, roots, capsys, field):
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")})
    data = bytearray(cache.read_bytes())
    header = data[: codec.PREFIX_SIZE + int.from_bytes(data[8:12], "little")]
    needle = {"keys": b"VecAVX2", "kind": b"kernel", "provenance": b"provenance", "size": b"\xa4size\x04"}[field]
    position = bytes(header).index(needle) + len(needle) - 1
    data[position] ^= 0x01  # one bit, inside the header, with every hash left as written
    cache.write_bytes(bytes(data))
    rc, out = _cli(capsys, "verify", "-v", str(artifact), str(cache))
    assert rc == 2 and ("does not match its header_sha256" in out or "invalid header" in out), out  # a cache whose header is not its digest is not read as one: trouble (docs/inspect.md, exit codes)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not precompile.load(artifact, cache).cache_used
    assert any(issubclass(w.category, precompile.PrecompileWarning) for w in caught)


def test_a_header_that_lost_its_digest_is_read_but_its_kernels_are_not_served(tmp_path, roots, capsys):
    inductor, _ = roots
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")})
    data = cache.read_bytes()
    envelope, offset = codec.decode_header(data)
    header = msgspec.msgpack.encode(msgspec.structs.replace(envelope, header_sha256=""))
    cache.write_bytes(codec.MAGIC + len(header).to_bytes(4, "little") + header + data[offset:])
    _load_warns(artifact, cache, "its header has no header_sha256", cache_used=True)
    assert _written(inductor) == []
    rc, out = _cli(capsys, "show", str(artifact), str(cache))
    assert "load does not serve these kernels (it compiles them instead): its header has no header_sha256" in out


# -- finding 9: load adopted a .pending file no verb inspected --------------------------------------
def test_a_pending_cache_is_checked_as_a_cache_before_it_is_adopted_and_the_verbs_report_it(tmp_path, roots, capsys):
    inductor, canary = roots
    target = canary / "pwned.pth"
    artifact, cache = _pair(tmp_path, {})
    old = cache.read_bytes()
    artifact.write_bytes(artifact.read_bytes() + b"# a newer capture\n")  # its writer died before the cache's rename
    _, pending = _pair(tmp_path, {"triton/0/abc/k.cubin": ("triton", b"x" * 16)}, name="hostile")
    _forge(pending, bundle=dict(files=[{"path": f"triton/0/{target}", "kind": "triton", "size": 16,
                                        "sha256": hashlib.sha256(b"x" * 16).hexdigest()}]),
           code_hash=hashlib.sha256(artifact.read_bytes()).hexdigest())
    pending.replace(pending_path(cache))
    with pytest.raises(precompile.PrecompileError, match="came from different captures"):
        precompile.load(artifact, cache)
    assert not target.exists() and _written(inductor) == [] and cache.read_bytes() == old
    assert pending_path(cache).exists()  # left for a person to look at
    rc, out = _cli(capsys, "verify", "-v", str(artifact), str(cache))
    assert rc == 1 and "FAIL  pending cache" in out
    rc, out = _cli(capsys, "show", str(artifact), str(cache))
    assert rc == 1 and "m.cache.pending exists (left by an interrupted write)" in out


# -- finding 10: resources and raw errors -----------------------------------------------------------
def test_a_fifo_in_place_of_either_file_is_refused_without_blocking(tmp_path, capsys):
    artifact, cache = _pair(tmp_path, {})
    cache.unlink()
    os.mkfifo(cache)
    with pytest.warns(precompile.PrecompileWarning, match="is not a regular file"):
        precompile.load(artifact, cache)
    rc, out = _cli(capsys, "verify", "-v", str(artifact), str(cache))
    assert rc == 2 and "is not a regular file" in out  # unreadable input: trouble
    fifo = tmp_path / "f.py"
    os.mkfifo(fifo)
    with pytest.raises(precompile.PrecompileError, match=r"f\.py is not a regular file \(it is a FIFO\)"):
        precompile.load(fifo, cache)


def test_a_zstd_bomb_is_refused_before_it_is_decompressed(tmp_path, roots, capsys):
    zeros = b"\0" * (100 * 1024 * 1024)
    bomb = zstandard.ZstdCompressor(level=19, write_content_size=True).compress(zeros)
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")})
    envelope, _ = codec.decode_header(cache.read_bytes())
    entry = msgspec.structs.replace(envelope.bundle.files[0], size=len(zeros), sha256=hashlib.sha256(zeros).hexdigest())
    bundle = msgspec.structs.replace(envelope.bundle, files=(entry,), payload_size=entry.size, payload_compressed_size=len(bomb),
                                     payload_sha256=hashlib.sha256(bomb).hexdigest())
    cache.write_bytes(codec.encode_cache(msgspec.structs.replace(envelope, bundle=bundle), bomb))
    _load_warns(artifact, cache, "more than 200 times their size", cache_used=True)
    rc, out = _cli(capsys, "verify", "-v", str(artifact), str(cache))
    assert rc == 1 and "decompression bomb" in out


def test_the_payload_limit_is_the_users_to_raise(tmp_path, monkeypatch):
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF" * 1000)})
    monkeypatch.setenv(codec.PAYLOAD_LIMIT_VAR, "100")
    envelope, offset = codec.decode_header(cache.read_bytes())
    assert "over the 100-byte limit (set PRECOMPILE_MAX_PAYLOAD_BYTES to raise it" in codec.payload_problem(
        envelope.bundle, cache.read_bytes(), offset)


def test_a_header_nested_a_thousand_deep_is_a_cache_format_error(tmp_path):
    nested = b"\x91" * 1000 + b"\xc0"
    header = b"\x82\xaeformat_version\x01\xa9code_hash" + nested
    with pytest.raises(codec.CacheFormatError, match="unreadable header|invalid header"):
        codec.decode_header(codec.MAGIC + len(header).to_bytes(4, "little") + header)


def test_a_bundle_of_too_many_entries_is_refused_before_anything_is_written(tmp_path, roots):
    inductor, _ = roots
    files = {f"ab/c{i}.best_config": ("autotune-result", b"") for i in range(20_001)}
    artifact, cache = _pair(tmp_path, files)
    _load_warns(artifact, cache, "lists 20001 files, over the 20000-file limit")
    assert _written(inductor) == []


@pytest.mark.parametrize("version", [0, -1])
def test_a_format_version_no_precompile_wrote_is_refused_by_name(version):
    header = msgspec.msgpack.encode({"format_version": version, "code_hash": "x"})
    with pytest.raises(codec.CacheFormatError, match=f"format version {version}, which no precompile ever wrote"):
        codec.decode_header(codec.MAGIC + len(header).to_bytes(4, "little") + header)


def test_a_well_formed_bundle_is_primed_inside_the_inductor_root_only(tmp_path, roots):
    """The positive case: an accepted bundle is written where Inductor and Triton look, nowhere else."""
    inductor, canary = roots
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF"), "ab/cabc.main.cpp": ("kernel-source", b"int k;")},
                            kernels={SOURCE_SHA: KERNEL})
    with warnings.catch_warnings():
        warnings.simplefilter("error", precompile.PrecompileWarning)
        runnable = precompile.load(artifact, cache)
    assert runnable.cache_used
    assert _written(inductor) == ["ab", "ab/cabc.main.cpp", "ab/cabc.main.so"] and _written(canary) == []


# -- found by a review after the fixes above --------------------------------------------------------
def test_two_triton_files_that_would_land_on_one_file_are_refused(tmp_path):
    artifact, cache = _pair(tmp_path, {"triton/0/x.json": ("triton", b"AAAA"), "triton/1/x.json": ("triton", b"BBBB")})
    problem = parse_cache(cache, cache.read_bytes()).problem
    assert "'triton/0/x.json' and 'triton/1/x.json' would be written to the same file" in problem


def test_under_triton_only_triton_files_are_accepted(tmp_path):
    artifact, cache = _pair(tmp_path, {KERNEL: ("kernel", b"\x7fELF")})
    _forge(cache, bundle=dict(files=[{"path": "triton/ab.main.so", "kind": "kernel", "size": 4,
                                      "sha256": hashlib.sha256(b"\x7fELF").hexdigest()}]))
    assert "bundle entry 'triton/ab.main.so' is not a file capture bundles" in parse_cache(cache, cache.read_bytes()).problem


def test_two_kernels_loaded_under_one_module_name_are_refused(tmp_path):
    artifact, cache = _pair(tmp_path, {"aa/ck.main.so": ("kernel", b"\x7fELF"), "bb/ck.main.so": ("kernel", b"\x7fELF2")})
    assert "share the module name 'ck'" in parse_cache(cache, cache.read_bytes()).problem


def test_a_fifo_signature_is_refused_without_blocking(tmp_path, capsys):
    artifact, cache = _pair(tmp_path, {})
    os.mkfifo(tmp_path / "m.sig")
    rc, out = _cli(capsys, "verify", "-v", str(artifact), str(cache))
    assert "signature" in out and "is not a regular file" in out


def test_an_optimization_level_python_cannot_compile_at_is_a_problem_not_a_traceback():
    from precompile.artifact import bytecode, bytecode_check
    from precompile.artifact.pycode import code_hash, decode_source, parse_source

    data = (FIXTURES / "mlp.py").read_bytes()
    source, digest = decode_source(data), code_hash(data)
    tree = parse_source(source)
    compiled, _ = bytecode.prepare(source, digest, _metadata(), tree)
    forged = msgspec.structs.replace(compiled, optimize=2**62)
    assert bytecode_check.bytecode_problem(source, digest, forged, tree) == "it records optimization level 4611686018427387904; Python compiles at 0, 1 or 2"


def _metadata():
    from precompile.artifact.pycode import parse_metadata

    return parse_metadata((FIXTURES / "mlp.py").read_text(encoding="utf-8"))


def test_an_entry_written_where_another_needs_a_directory_is_refused_before_anything_is_written(tmp_path):
    # Found by a hostile review: load wrote the entries up to the second one, failed on it, and left the
    # first (a Triton group naming files of a bundle it then said it ignored) where Triton reads.
    artifact, cache = _pair(tmp_path, {"triton/0/ABC/k.json": ("triton", b"{}"), "triton/0/ABC/k.json/x": ("triton", b"x")})
    problem = parse_cache(cache, cache.read_bytes()).problem
    assert "bundle entry 'triton/0/ABC/k.json' is a file where 'triton/0/ABC/k.json/x' needs a directory" in problem
