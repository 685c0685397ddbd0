"""Signed pairs: keygen, sign, verify --trusted-key and load(trusted_keys=) / PRECOMPILE_TRUSTED_KEYS.

Torch-free except the fresh-process load test, which serves the eager fixture fixtures/v1/mlp.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import ROOT, TESTS, run_fresh
from precompile.errors import PrecompileError
from precompile.signing import TRUSTED_KEYS_ENV, check_pair, generate, pins_for, read_trusted_keys, require_trusted, sign_pair
from test_inspect_helpers import FIXTURES, run_cli


def _require(python_code: str, cache: str, trusted_keys) -> None:
    """load's signature rule, as load applies it: on the bytes it read (a cache it cannot read is None)."""
    pins = pins_for(trusted_keys)
    if pins:
        cached = Path(cache).read_bytes() if Path(cache).is_file() else None
        require_trusted(python_code, cache, pins, (Path(python_code).read_bytes(), cached))


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A copy of the eager fixture pair fixtures/v1/mlp, a release key pair and another key pair, in tmp_path."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(TRUSTED_KEYS_ENV, raising=False)
    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / "v1" / f"mlp{suffix}", tmp_path / f"mlp{suffix}")
    generate(tmp_path / "release")
    generate(tmp_path / "other")
    return tmp_path


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_sign_then_verify_ok(pair, capsys):
    rc, out, err = run_cli(capsys, ["sign", "mlp", "--key", "release.key"])
    assert rc == 0, err
    assert "wrote mlp.sig" in out
    signature = json.loads((pair / "mlp.sig").read_text())
    assert signature["format"] == "precompile-signature/1"
    fingerprint = read_trusted_keys("release.pub")[0].fingerprint
    assert signature["key"] == fingerprint
    rc, out, err = run_cli(capsys, ["verify", "-v", "mlp", "--trusted-key", "other.pub", "--trusted-key", "release.pub"])
    assert rc == 0, err
    assert f"ok    signature: signed by key {fingerprint} (release.pub)" in out
    rc, out, _ = run_cli(capsys, ["verify", "-v", "--json", "mlp", "--trusted-key", "release.pub"])
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "signature")
    assert check["status"] == "ok" and check["actual"] == fingerprint


def test_sign_json_prints_the_signature_written(pair, capsys):
    rc, out, _ = run_cli(capsys, ["sign", "--json", "mlp.py", "mlp.cache", "--key", "release.key"])
    assert rc == 0
    assert json.loads(out) == json.loads((pair / "mlp.sig").read_text())


def test_verify_without_keys_tells_signed_from_unsigned(pair, capsys):
    rc, out, _ = run_cli(capsys, ["verify", "-v", "mlp"])
    assert rc == 0
    assert "skip  signature: unsigned: no signature file mlp.sig" in out
    sign_pair("mlp.py", "mlp.cache", "release.key")
    rc, out, _ = run_cli(capsys, ["verify", "-v", "mlp"])
    assert rc == 0
    assert "skip  signature: present, not checked: mlp.sig names key SHA256:" in out


@pytest.mark.parametrize("role,offset", [("py", 100), ("cache", -1)])
def test_a_flipped_byte_in_either_file_voids_the_signature(pair, capsys, role, offset):
    sign_pair("mlp.py", "mlp.cache", "release.key")
    _flip(pair / f"mlp.{role}", offset)
    keys = read_trusted_keys(["release.pub"])
    verdict = check_pair("mlp.py", "mlp.cache", keys)
    assert verdict.status == "fail"
    what = {"py": "python_code mlp.py", "cache": "cache mlp.cache"}[role]
    assert verdict.message.startswith(f"{what} is not the file mlp.sig covers")
    assert verdict.expected != verdict.actual and "sha256" in verdict.actual
    rc, out, err = run_cli(capsys, ["verify", "-v", "mlp", "--trusted-key", "release.pub"])
    # mlp.cache ends in its header: flipped there, the cache no longer decodes, which is trouble (2) as
    # for `show`; a python_code that reads but is not the one signed is a finding (1)
    assert rc == (2 if role == "cache" else 1)
    assert "FAIL  signature" in out and "verified: FAILED" in out


def test_swapped_or_edited_signature_fields_do_not_verify(pair):
    sign_pair("mlp.py", "mlp.cache", "release.key")
    document = json.loads((pair / "mlp.sig").read_text())
    document["python_code"], document["cache"] = document["cache"], document["python_code"]
    (pair / "mlp.sig").write_text(json.dumps(document))
    verdict = check_pair("mlp.py", "mlp.cache", read_trusted_keys(["release.pub"]))
    assert verdict.status == "fail" and "does not verify" in verdict.message


def test_a_key_that_did_not_sign_fails(pair, capsys):
    sign_pair("mlp.py", "mlp.cache", "other.key")
    release = read_trusted_keys("release.pub")[0].fingerprint
    rc, out, err = run_cli(capsys, ["verify", "-v", "mlp", "--trusted-key", "release.pub"])
    assert rc == 1
    assert "which is not trusted" in out and release in out
    # a signature made with another key but naming the release key's fingerprint is a forgery
    document = json.loads((pair / "mlp.sig").read_text())
    (pair / "mlp.sig").write_text(json.dumps({**document, "key": release}))
    verdict = check_pair("mlp.py", "mlp.cache", read_trusted_keys("release.pub"))
    assert verdict.status == "fail" and "does not verify" in verdict.message


def test_renaming_the_pair_with_its_signature_keeps_it_signed(pair):
    sign_pair("mlp.py", "mlp.cache", "release.key")
    for suffix in (".py", ".cache", ".sig"):
        os.rename(f"mlp{suffix}", f"renamed{suffix}")
    assert check_pair("renamed.py", "renamed.cache", read_trusted_keys("release.pub")).status == "ok"


def test_a_missing_cache_is_refused_not_degraded(pair):
    sign_pair("mlp.py", "mlp.cache", "release.key")
    os.remove("mlp.cache")
    with pytest.raises(PrecompileError, match=r"cache mlp.cache does not exist, but mlp.sig covers one.*remedy: restore the cache"):
        _require("mlp.py", "mlp.cache", ["release.pub"])


def test_unsigned_pair_is_refused_naming_file_keys_and_remedy(pair):
    fingerprint = read_trusted_keys("release.pub")[0].fingerprint
    with pytest.raises(PrecompileError) as caught:
        _require("mlp.py", "mlp.cache", [(pair / "release.pub").read_bytes()])
    message = str(caught.value)
    assert "refusing to load the pair (mlp.py, mlp.cache)" in message and "no signature file mlp.sig" in message
    assert f"expected a signature by one of {fingerprint} ((PEM bytes)), found no signature" in message
    assert "remedy: have the release key's holder sign it: precompile sign mlp.py mlp.cache --key RELEASE.key" in message


def test_the_environment_pins_keys_code_cannot_loosen(pair, monkeypatch):
    sign_pair("mlp.py", "mlp.cache", "other.key")
    _require("mlp.py", "mlp.cache", None)  # nothing pinned: nothing checked
    monkeypatch.setenv(TRUSTED_KEYS_ENV, os.pathsep.join(["release.pub", ""]))
    with pytest.raises(PrecompileError, match="which is not trusted"):
        _require("mlp.py", "mlp.cache", None)
    with pytest.raises(PrecompileError, match=f"which {TRUSTED_KEYS_ENV} does not trust"):
        _require("mlp.py", "mlp.cache", ["other.pub"])
    sign_pair("mlp.py", "mlp.cache", "release.key")
    _require("mlp.py", "mlp.cache", None)
    with pytest.raises(PrecompileError, match=r"which load\(trusted_keys=...\) does not trust"):
        _require("mlp.py", "mlp.cache", ["other.pub"])
    monkeypatch.setenv(TRUSTED_KEYS_ENV, os.pathsep)
    with pytest.raises(PrecompileError, match=f"{TRUSTED_KEYS_ENV} is set but names no key"):
        _require("mlp.py", "mlp.cache", None)
    monkeypatch.setenv(TRUSTED_KEYS_ENV, "missing.pub")
    with pytest.raises(PrecompileError, match=f"{TRUSTED_KEYS_ENV}: public key missing.pub does not exist"):
        _require("mlp.py", "mlp.cache", None)


@pytest.mark.parametrize("given,match", [
    ([], "trusted_keys is empty"),
    (["release.key"], "key release.key is a private key, expected a public key"),
    (["mlp.py"], "key mlp.py is not a PEM public key"),
    ([b"-----BEGIN PUBLIC KEY-----\n"], r"key \(PEM bytes\) is not a PEM public key"),
    ("-----BEGIN PUBLIC KEY-----\n", "a trusted key was given as a str of PEM text, where a str is a path; pass the PEM as bytes"),
])
def test_bad_trusted_keys_name_the_key_and_the_remedy(pair, given, match):
    with pytest.raises(PrecompileError, match=match):
        read_trusted_keys(given)


def test_keys_of_another_kind_are_refused_naming_the_kinds_expected(pair):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    for key in (ed25519.Ed25519PrivateKey.generate(), ec.generate_private_key(ec.SECP256K1())):
        pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        with pytest.raises(PrecompileError, match=r"key \(PEM bytes\) is .*expected .*secp256r1, secp384r1, secp521r1"):
            read_trusted_keys(pem)


def test_damaged_or_newer_signature_files(pair, capsys):
    (pair / "mlp.sig").write_text('{"format": "precompile-signature/9"}')
    rc, out, _ = run_cli(capsys, ["verify", "-v", "mlp", "--trusted-key", "release.pub"])
    assert rc == 1 and "this precompile reads 'precompile-signature/1'; upgrade precompile" in out
    (pair / "mlp.sig").write_text("not json")
    with pytest.raises(PrecompileError, match="signature mlp.sig is not a precompile signature file"):
        _require("mlp.py", "mlp.cache", "release.pub")
    rc, out, _ = run_cli(capsys, ["verify", "-v", "mlp"])
    assert rc == 0 and "skip  signature: present, not checked, and unreadable" in out


def test_help_lists_the_signing_verbs(capsys):
    rc, out, _ = run_cli(capsys, ["--help"])
    assert rc == 0 and "keygen" in out and "sign" in out
    rc, out, _ = run_cli(capsys, ["verify", "-v", "--help"])
    assert rc == 0 and "--trusted-key" in out


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(pair, capsys):
    assert stat.S_IMODE(os.stat("release.key").st_mode) == 0o600
    rc, out, err = run_cli(capsys, ["keygen", "--out", "release"])
    assert rc == 2 and "precompile: error: release.key exists; keygen never overwrites a key" in err
    rc, out, err = run_cli(capsys, ["keygen", "--out", "fresh"])
    assert rc == 0 and "fingerprint SHA256:" in out


def test_sign_refuses_a_pair_that_fails_verify(pair, capsys):
    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / "damaged" / f"mismatched{suffix}", pair / f"mismatched{suffix}")
    rc, out, err = run_cli(capsys, ["sign", "mismatched", "--key", "release.key"])
    assert rc == 1 and "not signing (mismatched.py, mismatched.cache): it fails verify" in err
    assert not (pair / "mismatched.sig").exists()
    rc, out, err = run_cli(capsys, ["sign", "mlp", "--key", "release.pub"])
    assert rc == 2 and "key release.pub is not a PEM private key" in err


SIGN_AND_VERIFY = """
import socket, sys
def offline(*args, **kwargs):
    raise OSError("network access attempted")
socket.socket.connect = socket.create_connection = socket.getaddrinfo = offline
from precompile.cli.main import main
for argv in (["keygen", "--out", "k"], ["sign", "mlp", "--key", "k.key"], ["verify", "-v", "mlp", "--trusted-key", "k.pub"]):
    assert main(["--color", "never", *argv]) == 0, argv
print(sorted(name for name in sys.modules if name == "torch" or name.startswith("torch.")))
"""


def test_sign_and_verify_need_neither_torch_nor_network(pair):
    proc = run_fresh(SIGN_AND_VERIFY)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


WITHOUT_EXTRA = """
import sys
sys.modules["cryptography"] = None  # as if the sign extra were not installed
from precompile.cli.main import main
print(*(main(["--color", "never", *argv]) for argv in (
    ["verify", "-v", "mlp"], ["sign", "mlp", "--key", "release.key"], ["verify", "-v", "mlp", "--trusted-key", "release.pub"])))
import precompile.signing
assert precompile.signing.pins_for(None) == []  # nothing pinned: load checks nothing and needs no extra
"""


def test_without_the_sign_extra_signing_names_it_and_unchecked_paths_still_work(pair):
    proc = run_fresh(WITHOUT_EXTRA)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "0 2 2"
    assert "install the extra: pip install 'precompile[sign]'" in proc.stderr


LOAD = """
import json, os, sys
import torch
import precompile
results = {}
def attempt(name, **kwargs):
    try:
        runnable = precompile.load("mlp.py", "mlp.cache", **kwargs)
        results[name] = "loaded, cache used" if runnable.cache_used else "loaded"
    except precompile.PrecompileError as exc:
        results[name] = "refused: " + str(exc)
attempt("unsigned", trusted_keys=["release.pub"])
os.environ["PRECOMPILE_TRUSTED_KEYS"] = "release.pub"
attempt("unsigned, env pinned")
from precompile.signing import sign_pair
sign_pair("mlp.py", "mlp.cache", "release.key")
attempt("signed, env pinned")
attempt("signed, pinned, other key passed", trusted_keys=["other.pub"])
with open("mlp.py", "a") as handle:
    handle.write("\\nopen('executed', 'w').close()\\n")
attempt("tampered")
results["executed"] = os.path.exists("executed")
print(json.dumps(results))
"""


def test_load_refuses_pairs_its_trusted_keys_did_not_sign_before_executing_them(pair):
    proc = run_fresh(LOAD)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["unsigned"].startswith("refused: refusing to load the pair (mlp.py, mlp.cache): unsigned: there is no "
                                          "signature file mlp.sig")
    assert results["unsigned, env pinned"].startswith("refused: ")
    assert results["signed, env pinned"] == "loaded, cache used"
    assert "which load(trusted_keys=...) does not trust" in results["signed, pinned, other key passed"]
    assert "python_code mlp.py is not the file mlp.sig covers" in results["tampered"]
    assert results["executed"] is False


RANK = """
import json, sys
import torch.distributed as dist
import precompile.distributed
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
where = "." if rank == 0 else "not-here"  # the pair and its signature exist only on rank 0
try:
    served = precompile.distributed.load_everywhere(f"{where}/mlp.py", f"{where}/mlp.cache")
    print(json.dumps("loaded, cache used" if served.cache_used else "loaded"))
except precompile.PrecompileError as exc:
    print(json.dumps("refused: " + str(exc)))
dist.destroy_process_group()
"""


def _on_two_ranks(directory: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    # A store file of its own per round: torch's FileStore may outlive the round that made it, and a
    # second round rendezvousing on the first's keys hangs until the timeout.
    store = directory / f"rendezvous-{uuid.uuid4().hex}"
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(store)], env=env, cwd=directory,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    try:
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-4000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]


def test_load_everywhere_ships_the_signature_so_every_rank_checks_it(pair, monkeypatch):
    monkeypatch.setenv(TRUSTED_KEYS_ENV, str(pair / "release.pub"))
    assert [r.startswith("refused: ") and "unsigned" in r for r in _on_two_ranks(pair)] == [True, True]
    sign_pair("mlp.py", "mlp.cache", "release.key")
    assert _on_two_ranks(pair) == ["loaded, cache used"] * 2
