"""The caches the ecosystem ships, read statically by every verb: upstream `torch.compiler.precompile`
pairs, the Mega-Cache container and bare pickles (fixtures/upstream, written by torch 2.14.1, and
fixtures/upstream/torch-2.15, by torch 2.15's caller-driven `capture`: the same format, version 1),
and one file alone told apart by its content."""
from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import subprocess
import sys
import zlib

import msgspec
import pytest

from test_inspect_helpers import FIXTURES, ROOT, run_cli

UPSTREAM = FIXTURES / "upstream"
RELEASES = {"2.14.1": "upstream", "2.15": "upstream/torch-2.15"}
"""Each torch release's upstream fixtures, by the folder under fixtures/ that make_upstream.py writes."""
PAIRS = ("eager", "inductor", "train_step")


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _show_json(capsys, *paths) -> tuple[int, dict, str]:
    from precompile.inspect.model.report import Report

    rc, out, err = run_cli(capsys, ["show", "--json", *map(str, paths)])
    msgspec.json.decode(out, type=Report)  # the report obeys its own schema
    return rc, json.loads(out)["artifact"], err


def _flagged(cache: dict) -> bool:
    """Whether any pickle the cache carries would import something not allowed (the scan decides)."""
    upstream = cache["upstream"] or {}
    mega = upstream.get("mega_cache") or ((upstream.get("precompile") or {}).get("artifact")) or {}
    scans = upstream.get("pickles", []) + [e["scan"] for e in mega.get("entries", []) if e["scan"]]
    return any(imp["risk"] != "allowed" for scan in scans for imp in scan["imports"])


def _mega_cache(entries: list[tuple[str, list[tuple[str, bytes]]]], version: int = 1) -> bytes:
    """A Mega-Cache as torch writes it (crc32 | u64 version | per kind: str, u64 count, (str key, bytes)*)."""
    def raw(b: bytes) -> bytes:
        return len(b).to_bytes(8, "big") + b

    def text(s: str) -> bytes:
        import base64

        return raw(base64.b64encode(s.encode()))

    body = version.to_bytes(8, "big")
    for kind, items in entries:
        body += text(kind) + len(items).to_bytes(8, "big") + b"".join(text(k) + raw(v) for k, v in items)
    return zlib.crc32(body).to_bytes(4, "big") + body


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", PAIRS)
def test_upstream_pair_is_recognised_and_pairs_by_code_hash(capsys, name, release):
    upstream = FIXTURES / RELEASES[release]
    rc, artifact, err = _show_json(capsys, upstream / name)
    code, cache = artifact["python_code"], artifact["cache"]
    assert code["problem"] is None and cache["problem"] is None, err
    assert code["format_version"] is None and code["upstream"]["backend"] == cache["upstream"]["precompile"]["backend"]
    literals = {lit["name"]: lit["value"] for lit in code["upstream"]["literals"]}
    assert {"BACKEND", "PARAM_NAMES", "USER_INPUT_SHAPES", "IN_SPEC", "OUT_SPEC"} <= set(literals)
    assert cache["kind"] == "upstream_precompile"
    envelope = cache["upstream"]["precompile"]
    assert envelope["code_hash"] == hashlib.sha256((upstream / f"{name}.py").read_bytes()).hexdigest()
    # 2.15 added the envelope's `tracer` field (2.14 wrote none, which upstream's load reads as make_fx).
    assert envelope["version"] == 1 and envelope["tracer"] == (None if release == "2.14.1" else "make_fx")
    assert code["upstream"]["tracer"] == "make_fx"  # no TRACER literal in either: a make_fx capture
    assert artifact["pairs"] is True and artifact["pairing_problem"] is None
    assert rc == (1 if _flagged(cache) else 0)
    rc_text, out, _ = run_cli(capsys, ["show", str(upstream / name)])
    assert rc_text == rc and "pairs: yes" in out and "upstream torch.compiler.precompile python_code (make_fx)" in out
    if name == "train_step":
        assert "GRAD_PARAM_INDICES = [0, 1, 2, 3]" in out and "USER_INPUT_SHAPES = [(3, 4), (3, 2)]" in out


@pytest.mark.parametrize("release", RELEASES)
def test_inductor_artifact_field_is_a_mega_cache_listed_entry_by_entry(capsys, release):
    upstream = FIXTURES / RELEASES[release]
    _, artifact, _ = _show_json(capsys, upstream / "inductor")
    mega = artifact["cache"]["upstream"]["precompile"]["artifact"]
    assert mega["encoding_version"] == 1 and mega["problem"] is None and mega["entries"]
    for entry in mega["entries"]:
        assert entry["kind"] and entry["key"] and entry["file"]["size"] > 0
        if entry["content"] == "pickle":
            assert entry["scan"]["imports"], entry  # what loading it would import, never loaded
    # Every byte is accounted for: checksum, version, and per kind its name, count and entries.
    kinds = {e["kind"] for e in mega["entries"]}
    overhead = 4 + 8 + sum(8 + len(__import__("base64").b64encode(k.encode())) + 8 for k in kinds)
    overhead += sum(8 + len(__import__("base64").b64encode(e["key"].encode())) + 8 for e in mega["entries"])
    assert overhead + sum(e["file"]["size"] for e in mega["entries"]) == mega["blob"]["size"]
    _, eager, _ = _show_json(capsys, upstream / "eager")
    assert eager["cache"]["upstream"]["precompile"]["artifact"] is None


@pytest.mark.parametrize("release", RELEASES)
def test_mismatched_upstream_pair_names_both_hashes(capsys, tmp_path, release):
    upstream = FIXTURES / RELEASES[release]
    shutil.copy(upstream / "eager.cache", tmp_path / "x.cache")
    (tmp_path / "x.py").write_bytes((upstream / "eager.py").read_bytes() + b"# edited\n")
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "x")])
    edited = hashlib.sha256((tmp_path / "x.py").read_bytes()).hexdigest()
    original = hashlib.sha256((upstream / "eager.py").read_bytes()).hexdigest()
    assert rc == 1 and "pairs: NO" in out and original in err and edited in err
    rc, out, err = run_cli(capsys, ["show", str(upstream / "eager.py"), str(upstream / "inductor.cache")])
    assert rc == 1 and "the cache's backend 'inductor' does not match the python_code BACKEND 'eager'" in err
    # The tracer tags pair too, as upstream 2.15's load checks them: a TRACER literal naming another tracer.
    shutil.copy(upstream / "eager.cache", tmp_path / "t.cache")
    (tmp_path / "t.py").write_bytes((upstream / "eager.py").read_bytes() + b"TRACER = 'dynamo'\n")
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "t")])
    assert rc == 1 and "the cache's tracer 'make_fx' does not match the python_code TRACER 'dynamo'" in err
    rc, out, _ = run_cli(capsys, ["verify", "-v", str(tmp_path / "t")])
    assert rc == 1 and "FAIL  tracer tag: the cache's tracer tag is make_fx, the python_code's is dynamo" in out


KINDS = {
    # file -> (name it is given, what show must call it): names mislead on purpose, content decides
    "v1/mlp.cache": ("ours.dat", "cache", "precompile"),
    "damaged/poisoned_raw.pkl": ("raw.json", "cache", "pickle"),
    "v1/mlp.py": ("code.bin", "python_code", None),
    **{f"{folder}/{file}": told for folder in RELEASES.values() for file, told in (
        ("inductor.cache", ("up.txt", "cache", "upstream_precompile")),
        ("mega_cache.bin", ("blob.py", "cache", "mega_cache")),
        ("eager.py", ("up.cache", "python_code", "upstream")))},
}


@pytest.mark.parametrize("source", sorted(KINDS))
def test_show_one_file_of_any_kind_told_by_content(capsys, tmp_path, source):
    name, side, kind = KINDS[source]
    shutil.copy(FIXTURES / source, tmp_path / name)
    rc, artifact, err = _show_json(capsys, tmp_path / name)
    assert artifact["given"] == side and "Traceback" not in err
    if side == "cache":
        assert artifact["cache"]["kind"] == kind and artifact["python_code"]["path"] == ""
    else:
        assert artifact["cache"]["kind"] == "absent" and artifact["python_code"]["problem"] is None
        assert (artifact["python_code"]["upstream"] is not None) == (kind == "upstream")
    assert rc == (1 if side == "cache" and _flagged(artifact["cache"]) else 0), err
    rc_text, out, _ = run_cli(capsys, ["show", str(tmp_path / name)])
    assert rc_text == rc and "pairs:" not in out
    if kind == "pickle":
        assert rc == 1 and "builtins.exec  FLAGGED: dangerous" in out


def test_bare_mega_cache_problems_are_reported_not_raised(capsys, tmp_path):
    good = (UPSTREAM / "mega_cache.bin").read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01
    (tmp_path / "flipped.bin").write_bytes(bytes(flipped))
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "flipped.bin")])
    assert rc == 2 and "(mega_cache, 157657 bytes)" in out and "Mega-Cache checksum is 65364944 but the content's crc32 is" in err
    entry = pickle.dumps({"x": 1}, protocol=4)
    truncated = _mega_cache([("inductor", [("k1", entry), ("k2", entry)])])
    body = truncated[4:-10]
    (tmp_path / "short.bin").write_bytes(zlib.crc32(body).to_bytes(4, "big") + body)
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "short.bin")])
    assert rc == 2 and "inductor k1" in out and "Mega-Cache the content of inductor k2 at byte" in err and "only" in err
    newer = _mega_cache([("inductor", [("k", entry)])], version=2)
    (tmp_path / "newer.bin").write_bytes(newer)
    rc, out, err = run_cli(capsys, ["show", str(tmp_path / "newer.bin")])
    assert rc == 2 and "encoding version 2, this reader understands 1" in err


class _Hostile:
    def __reduce__(self):
        import os

        return os.system, ("touch PWNED",)


def test_a_dangerous_pickle_inside_a_mega_cache_entry_is_flagged_with_its_entry(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hostile = pickle.dumps(_Hostile(), protocol=2)
    (tmp_path / "mc.bin").write_bytes(_mega_cache([("aot_autograd", [("harmless", pickle.dumps([1, 2])), ("evil", hostile)])]))
    rc, out, err = run_cli(capsys, ["show", "mc.bin"])
    assert rc == 1 and "1 pickle (aot_autograd/evil) would import posix.system (dangerous)" in err
    assert "aot_autograd evil  pickle" in out and "posix.system  FLAGGED: dangerous" in out
    rc, out, _ = run_cli(capsys, ["diff", "mc.bin", "mc.bin"])
    assert rc == 0
    rc, out, _ = run_cli(capsys, ["extract", "mc.bin", "out"])
    assert rc == 0 and (tmp_path / "out/mega_cache/001-aot_autograd-evil").read_bytes() == hostile
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("release", RELEASES)
def test_diff_upstream_pairs_field_by_field_and_entry_by_entry(capsys, tmp_path, release):
    up = f"fixtures/{RELEASES[release]}"
    rc, out, err = run_cli(capsys, ["diff", f"{up}/eager", f"{up}/eager"])
    assert rc == 0 and "no differences" in out, err
    rc, out, err = run_cli(capsys, ["diff", "--json", f"{up}/eager.py", f"{up}/eager.cache",
                                    f"{up}/inductor.py", f"{up}/inductor.cache"])
    assert rc == 1, err
    entries = {(e["section"], e["key"]): e for e in json.loads(out)["entries"]}
    assert entries[("metadata", "BACKEND")]["a"] == "'eager'" and entries[("metadata", "BACKEND")]["b"] == "'inductor'"
    assert entries[("envelope", "backend")]["change"] == "changed"
    assert entries[("envelope", "artifact")]["a"] == "None" and entries[("envelope", "artifact")]["b"].startswith("Mega-Cache ")
    assert {key for section, key in entries if section == "entries"} and all(
        entries[k]["change"] == "added" for k in entries if k[0] == "entries")
    rc, out, _ = run_cli(capsys, ["diff", f"{up}/eager", f"{up}/train_step"])
    assert rc == 1 and "~ NUM_POSITIONAL_ARGS: 2 -> 3" in out and "~ GRAD_PARAM_INDICES: [] -> [0, 1, 2, 3]" in out
    # Two Mega-Cache blobs, entry by entry: one entry's content changed, one dropped.
    one, two = pickle.dumps([1]), pickle.dumps([2])
    (tmp_path / "a.bin").write_bytes(_mega_cache([("inductor", [("k1", one), ("k2", one)])]))
    (tmp_path / "b.bin").write_bytes(_mega_cache([("inductor", [("k1", two)])]))
    rc, out, _ = run_cli(capsys, ["diff", str(tmp_path / "a.bin"), str(tmp_path / "b.bin")])
    assert rc == 1 and "entries (1 changed, 1 removed)" in out
    assert f"~ inductor k1: pickle {len(one)} bytes sha256 {hashlib.sha256(one).hexdigest()}" in out
    assert "- inductor k2: pickle" in out


def test_diff_takes_two_pairs_or_two_artifacts_only(capsys):
    rc, _, err = run_cli(capsys, ["diff", "fixtures/v1/mlp", "fixtures/v1/mlp.cache", "fixtures/v1/mlp_b4"])
    assert rc == 2 and "diff compares two artifacts: A B, or A.py A.cache B.py B.cache; got 3 paths" in err
    rc, out, _ = run_cli(capsys, ["diff", "fixtures/v1/mlp.py", "fixtures/v1/mlp.cache", "fixtures/v1/mlp_b4.py", "fixtures/v1/mlp_b4.cache"])
    rc_prefix, out_prefix, _ = run_cli(capsys, ["diff", "fixtures/v1/mlp", "fixtures/v1/mlp_b4"])
    assert rc == rc_prefix == 1 and out == out_prefix


@pytest.mark.parametrize("release", RELEASES)
def test_extract_upstream_pair_writes_the_mega_cache_and_each_entry_raw(capsys, tmp_path, release):
    upstream = FIXTURES / RELEASES[release]
    _, artifact, _ = _show_json(capsys, upstream / "inductor")
    mega = artifact["cache"]["upstream"]["precompile"]["artifact"]
    rc, out, err = run_cli(capsys, ["extract", "--json", str(upstream / "inductor"), str(tmp_path / "out")])
    assert rc == 0, err
    out_dir = tmp_path / "out"
    blob = (out_dir / "mega_cache.bin").read_bytes()
    assert hashlib.sha256(blob).hexdigest() == mega["blob"]["sha256"]
    extracted = sorted(p for p in (out_dir / "mega_cache").iterdir() if p.is_file())  # kernels/ and code/ beside them
    assert [hashlib.sha256(p.read_bytes()).hexdigest() for p in extracted] == [e["file"]["sha256"] for e in mega["entries"]]
    metadata = json.loads((out_dir / "metadata.json").read_text())
    assert metadata["backend"] == "inductor" and any(lit["name"] == "OUT_SPEC" for lit in metadata["literals"])
    assert json.loads((out_dir / "envelope.json").read_text())["code_hash"] == artifact["cache"]["upstream"]["precompile"]["code_hash"]
    assert any(p.name.endswith("calling-convention-metadata.py") for p in (out_dir / "python_code").iterdir())
    rc, _, err = run_cli(capsys, ["extract", str(upstream / "mega_cache.bin"), str(tmp_path / "bare")])
    assert rc == 0 and (tmp_path / "bare/mega_cache.bin").read_bytes() == (upstream / "mega_cache.bin").read_bytes()


_EVERY_VERB = r"""
import json, os, sys
sys.modules["torch"] = None  # importing torch would raise
from precompile.cli.main import main
codes = {}
out, up = sys.argv[1], sys.argv[2]
for name in ("eager", "inductor", "train_step"):
    path = f"{up}/{name}"
    for argv in (["show", path], ["show", "--json", path], ["guards", path], ["verify", "-v", path],
                 ["extract", path, os.path.join(out, name)], ["diff", path, f"{up}/eager"],
                 ["report", path, "-o", os.path.join(out, name + ".html")]):
        codes[argv[0] + " " + name] = main(["--color", "never", *argv])
for argv in (["show", f"{up}/mega_cache.bin"], ["extract", f"{up}/mega_cache.bin", os.path.join(out, "mc")],
             ["diff", f"{up}/mega_cache.bin", f"{up}/inductor.cache"]):
    codes[argv[0] + " mega_cache.bin"] = main(["--color", "never", *argv])
print(json.dumps(codes), file=sys.stderr)
"""


@pytest.mark.parametrize("release", RELEASES)
def test_every_verb_reads_upstream_fixtures_without_torch(tmp_path, release):
    proc = subprocess.run([sys.executable, "-c", _EVERY_VERB, str(tmp_path), f"fixtures/{RELEASES[release]}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    codes = json.loads(proc.stderr.strip().splitlines()[-1])
    # Every verb reads every pair clean (none of their pickles imports more than torch's reviewed classes);
    # only diff of two different pairs finds something.
    differing = {"diff inductor", "diff train_step", "diff mega_cache.bin"}
    assert {verb: rc for verb, rc in codes.items() if rc != 0} == dict.fromkeys(differing, 1), codes


@pytest.mark.parametrize("release", RELEASES)
def test_guards_and_verify_of_upstream_pairs(capsys, release):
    up = f"fixtures/{RELEASES[release]}"
    rc, out, err = run_cli(capsys, ["guards", "--json", f"{up}/train_step"])
    assert rc == 0, err
    specs = {(s["kind"], s["path"]): s["value"] for s in json.loads(out)["guards"]["specializations"]}
    assert specs[("shape", "input leaf 1")] == "(3, 2)" and specs[("param", "2.weight")] == "(2, 8) torch.float32 cpu"
    rc, out, err = run_cli(capsys, ["verify", "-v", f"{up}/eager"])
    assert rc == 0 and "ok    code hash: " + hashlib.sha256((ROOT / up / "eager.py").read_bytes()).hexdigest() in out, out + err
    rc, out, _ = run_cli(capsys, ["verify", "-v", f"{up}/eager.py", f"{up}/train_step.cache"])
    assert rc == 1 and "FAIL  code hash: the cache's code hash is" in out


def _mutate(rng, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        index = rng.randrange(len(data) + 1)
        choice = rng.randrange(3)
        if choice == 0:
            del data[index:]
        elif choice == 1 and index < len(data):
            data[index] ^= 1 << rng.randrange(8)
        else:
            data[index:index] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    return bytes(data)


def test_mutated_mega_caches_and_upstream_envelopes_are_reported_never_raised():
    """Seeded mutations reach past the checksum (it is recomputed) and into data.pkl: every one reads
    into a model or a clean problem; the readers never raise and never call anything."""
    import random
    import zipfile

    from precompile.inspect.formats.mega_cache import read_mega_cache
    from precompile.inspect.formats.upstream import upstream_envelope

    rng = random.Random("formats-fuzz")
    mega = (UPSTREAM / "mega_cache.bin").read_bytes()
    data_pkl = zipfile.ZipFile(UPSTREAM / "inductor.cache").read("archive/data.pkl")
    problems = 0
    for _ in range(300):
        body = _mutate(rng, mega[4:])
        result = read_mega_cache(zlib.crc32(body).to_bytes(4, "big") + body, where="fuzz")
        problems += result.problem is not None
        envelope = upstream_envelope(_mutate(rng, data_pkl), where="fuzz")
        assert envelope is None or envelope.format == "torch.compiler.precompile"
    assert problems > 0  # the mutations did reach the parser's checks
