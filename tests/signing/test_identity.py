"""Signed identity (issue 38, finding 1): `sign --name --release` writes a DSSE envelope of an in-toto
statement, and verify --expect-name/--min-release, load(expect_name=, min_release=) and
PRECOMPILE_EXPECT_NAME / PRECOMPILE_MIN_RELEASE refuse another model or an older release signed by the
same trusted key.

The release history, all signed by one key: v1 is the eager fixture fixtures/v1/mlp, v2 (a fixed v1)
is fixtures/v1/mlp_b4, and an unrelated model is fixtures/v1/two_modules; each shipped as model.py,
model.cache and model.sig.
"""
from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import run_fresh
from precompile.errors import PrecompileError
from precompile.signing import TRUSTED_KEYS_ENV, check_pair, generate, read_trusted_keys, sign_pair
from test_inspect_helpers import FIXTURES, run_cli

EXPECT_NAME_ENV, MIN_RELEASE_ENV = "PRECOMPILE_EXPECT_NAME", "PRECOMPILE_MIN_RELEASE"


def _release(directory: Path, fixture: str, *, name: str | None, release: str | None) -> Path:
    """The fixture `fixture` shipped as directory/model.{py,cache}, signed with release.key as (name, release)."""
    directory.mkdir()
    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / "v1" / f"{fixture}{suffix}", directory / f"model{suffix}")
    sign_pair(directory / "model.py", directory / "model.cache", "release.key", name=name, release=release)
    return directory


def _deploy(source: Path, target: Path) -> None:
    """Put a release's three files where the deployment serves from, as an attacker with write access would."""
    for suffix in (".py", ".cache", ".sig"):
        shutil.copy(source / f"model{suffix}", target / f"model{suffix}")


@pytest.fixture
def history(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in (TRUSTED_KEYS_ENV, EXPECT_NAME_ENV, MIN_RELEASE_ENV):
        monkeypatch.delenv(name, raising=False)
    generate(tmp_path / "release")
    v1 = _release(tmp_path / "v1", "mlp", name="demo", release="1")
    v2 = _release(tmp_path / "v2", "mlp_b4", name="demo", release="2")
    other = _release(tmp_path / "other", "two_modules", name="other-model", release="7")
    legacy = _release(tmp_path / "legacy", "mlp", name=None, release=None)
    deployed = tmp_path / "deployed"
    deployed.mkdir()
    _deploy(v2, deployed)
    return {"v1": v1, "v2": v2, "other": other, "legacy": legacy, "deployed": deployed}


def _verify(capsys, *flags: str) -> tuple[int, str]:
    rc, out, _ = run_cli(capsys, ["verify", "-v", "deployed/model.py", "deployed/model.cache", "--trusted-key", "release.pub", *flags])
    return rc, out


def test_the_signature_is_a_dsse_envelope_of_an_in_toto_statement(history):
    document = json.loads((history["v2"] / "model.sig").read_text())
    assert document["payloadType"] == "application/vnd.in-toto+json"
    [signature] = document["signatures"]
    fingerprint = read_trusted_keys("release.pub")[0].fingerprint
    assert signature["keyid"] == fingerprint
    payload = base64.b64decode(document["payload"], validate=True)
    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://precompile.dev/signed-pair/v1"
    import hashlib
    assert [(s["name"], s["digest"], s["annotations"]["role"]) for s in statement["subject"]] == [
        ("model.py", {"sha256": hashlib.sha256((history["v2"] / "model.py").read_bytes()).hexdigest()}, "python_code"),
        ("model.cache", {"sha256": hashlib.sha256((history["v2"] / "model.cache").read_bytes()).hexdigest()}, "cache"),
    ]
    predicate = statement["predicate"]
    assert (predicate["name"], predicate["release"]) == ("demo", "2")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", predicate["created"])
    capture = predicate["capture"]
    assert (capture["backend"], capture["tracer"]) == ("eager", "make_fx")
    assert capture["fn"].endswith("mlp_step") and capture["torch"].startswith("2.")
    # DSSE signs PAE(payloadType, payload), checked here with cryptography alone
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    public = serialization.load_pem_public_key(Path("release.pub").read_bytes())
    kind = b"application/vnd.in-toto+json"
    pae = b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)
    public.verify(base64.b64decode(signature["sig"]), pae, ec.ECDSA(hashes.SHA256()))


def test_a_tampered_payload_is_refused(history, capsys):
    sig = history["deployed"] / "model.sig"
    document = json.loads(sig.read_text())
    statement = json.loads(base64.b64decode(document["payload"]))
    statement["predicate"]["release"] = "99"
    document["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    sig.write_text(json.dumps(document))
    rc, out = _verify(capsys, "--min-release", "2")
    assert rc == 1
    assert "FAIL  signature: deployed/model.sig names key SHA256:" in out and "does not verify" in out


def test_verify_prints_the_signed_identity_and_show_prints_what_it_says(history, capsys):
    rc, out = _verify(capsys, "--expect-name", "demo", "--min-release", "2")
    assert rc == 0, out
    assert re.search(r"ok    signature: signed by key SHA256:\w+ \(release.pub\): name 'demo', release 2, created \S+Z "
                     r"\(fn \S+mlp_step, backend eager, tracer make_fx, torch 2\.", out)
    rc, out, _ = run_cli(capsys, ["show", "deployed/model.py", "deployed/model.cache"])
    assert rc == 0
    assert re.search(r"signature: present, not checked: deployed/model.sig \(a DSSE in-toto statement\) says name 'demo', "
                     r"release 2, created \S+Z .*signed by key SHA256:\w+", out)


def test_rollback_to_an_older_release_is_refused_by_verify(history, capsys):
    _deploy(history["v1"], history["deployed"])
    rc, out = _verify(capsys)  # no minimum pinned: the replay is what this cannot stop
    assert rc == 0, out
    rc, out = _verify(capsys, "--min-release", "2")
    assert rc == 1
    assert ("FAIL  signature: deployed/model.sig: it is signed as release 1 of 'demo', older than the minimum release 2 "
            "that --expect-name/--min-release requires: a rollback to an older release") in out


def test_another_model_under_the_same_file_names_is_refused_by_verify(history, capsys):
    _deploy(history["other"], history["deployed"])
    rc, out = _verify(capsys, "--expect-name", "demo")
    assert rc == 1
    assert ("FAIL  signature: deployed/model.sig: it is signed as name 'other-model' (release 7), but "
            "--expect-name/--min-release expects name 'demo': another model signed by a trusted key") in out


@pytest.mark.parametrize("floor,signed,refused", [("10", "9", True), ("9", "10", False), ("1.10", "1.9", True),
                                                  ("1.9", "1.10", False), ("2.0", "2.0rc1", True), ("2", "2.0", False)])
def test_releases_compare_as_pep_440_versions(history, floor, signed, refused, tmp_path):
    _release(tmp_path / f"r{signed}", "mlp", name="demo", release=signed)
    from precompile.signing.identity import expectation

    verdict = check_pair(tmp_path / f"r{signed}" / "model.py", tmp_path / f"r{signed}" / "model.cache",
                         read_trusted_keys("release.pub"), expect=[expectation("test", None, floor)])
    assert (verdict.status == "fail") is refused, verdict.message


def test_an_old_signature_still_verifies_says_it_binds_no_identity_and_fails_an_expectation(history, capsys):
    _deploy(history["legacy"], history["deployed"])
    assert json.loads((history["deployed"] / "model.sig").read_text())["format"] == "precompile-signature/1"
    rc, out = _verify(capsys)
    assert rc == 0, out
    assert "binds no identity (no name or release)" in out and "re-sign with --name/--release" in out
    rc, out = _verify(capsys, "--expect-name", "demo")
    assert rc == 1
    assert "is signed by key" in out and "in the first signature format, which binds no identity" in out
    rc, out, _ = run_cli(capsys, ["verify", "-v", "--json", "deployed/model.py", "deployed/model.cache", "--trusted-key", "release.pub",
                                  "--min-release", "1"])
    check = next(c for c in json.loads(out)["checks"] if c["name"] == "signature")
    assert "--name NAME --release N" in check["remedy"]


def test_sign_takes_a_name_and_a_release_together_and_a_release_that_is_one(history, capsys):
    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / "v1" / f"mlp{suffix}", f"mlp{suffix}")
    rc, _, err = run_cli(capsys, ["sign", "mlp", "--key", "release.key", "--name", "demo"])
    assert rc == 2 and "a signed identity is a name and a release: pass both" in err
    rc, _, err = run_cli(capsys, ["sign", "mlp", "--key", "release.key", "--name", "demo", "--release", "next"])
    assert rc == 2 and "--release 'next' is not a release: pass an integer" in err
    rc, out, err = run_cli(capsys, ["sign", "mlp", "--key", "release.key"])
    assert rc == 0 and "warning: mlp.sig binds no identity" in err
    rc, _, err = run_cli(capsys, ["verify", "mlp", "--expect-name", "demo"])
    assert rc == 1 and "no key is trusted to check it with" in err


LOAD = """
import json, os, sys
import torch
import precompile
results = {}
def attempt(name, **kwargs):
    try:
        runnable = precompile.load("deployed/model.py", "deployed/model.cache", **kwargs)
        results[name] = "loaded, cache used" if runnable.cache_used else "loaded"
    except precompile.PrecompileError as exc:
        results[name] = "refused: " + str(exc)
pinned = {"trusted_keys": ["release.pub"], "expect_name": "demo", "min_release": 2}
attempt("v2", **pinned)
attempt("expectation, no key", expect_name="demo")
os.environ["PRECOMPILE_TRUSTED_KEYS"] = "release.pub"
os.environ["PRECOMPILE_EXPECT_NAME"] = "demo"
os.environ["PRECOMPILE_MIN_RELEASE"] = "2"
attempt("v2, env pinned")
attempt("v2, env pinned, code asks for release 3", min_release="3")
import shutil
def deploy(release):
    for suffix in (".py", ".cache", ".sig"):
        shutil.copy(f"{release}/model{suffix}", f"deployed/model{suffix}")
deploy("v1")
attempt("rollback, env pinned")
for name in ("PRECOMPILE_EXPECT_NAME", "PRECOMPILE_MIN_RELEASE"):
    del os.environ[name]
attempt("rollback", **pinned)
attempt("rollback, no minimum pinned")
deploy("other")
attempt("substitution", **pinned)
deploy("legacy")
attempt("legacy", trusted_keys=["release.pub"])
attempt("legacy, expectation", **pinned)
print(json.dumps(results))
"""


def test_load_in_a_fresh_process_refuses_rollback_and_substitution(history):
    proc = run_fresh(LOAD)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["v2"] == results["v2, env pinned"] == "loaded, cache used"
    assert results["expectation, no key"].startswith(
        "refused: refusing to load the pair (deployed/model.py, deployed/model.cache): an expected name or minimum release "
        "(load(expect_name=, min_release=)) is checked on a signature, but no key is trusted to check it with")
    assert "signed as release 2 of 'demo', older than the minimum release 3 that load(expect_name=, min_release=) requires" in (
        results["v2, env pinned, code asks for release 3"])
    assert results["rollback, env pinned"].startswith("refused: refusing to load the pair (deployed/model.py, deployed/model.cache): "
                                                      "deployed/model.sig: it is signed as release 1 of 'demo', older than the minimum "
                                                      "release 2 that PRECOMPILE_EXPECT_NAME/PRECOMPILE_MIN_RELEASE requires")
    assert "older than the minimum release 2 that load(expect_name=, min_release=) requires" in results["rollback"]
    assert "expected name 'demo' and release >= 2" in results["rollback"] and "found name 'demo', release 1" in results["rollback"]
    assert results["rollback, no minimum pinned"] == "loaded, cache used"  # what a pin-less host cannot tell (docs/trust.md)
    assert "signed as name 'other-model' (release 7), but load(expect_name=, min_release=) expects name 'demo'" in results["substitution"]
    assert results["legacy"] == "loaded, cache used"
    assert "binds no identity" in results["legacy, expectation"] and "--name NAME --release N" in results["legacy, expectation"]


def test_bad_pins_name_the_pin(history, monkeypatch):
    from precompile.signing.identity import expectations_for

    monkeypatch.setenv(MIN_RELEASE_ENV, "latest")
    with pytest.raises(PrecompileError, match=r"PRECOMPILE_EXPECT_NAME/PRECOMPILE_MIN_RELEASE: the minimum release 'latest' is not a release"):
        expectations_for(None, None, argument="load(expect_name=, min_release=)")
    monkeypatch.delenv(MIN_RELEASE_ENV)
    with pytest.raises(PrecompileError, match=r"load\(expect_name=, min_release=\): the expected name is empty"):
        expectations_for("", None, argument="load(expect_name=, min_release=)")


@pytest.mark.parametrize(("name", "release", "message"), [
    ("demo", 1.10, r"the minimum release must be an integer or a PEP 440 version as text .*got float 1\.1"),
    (5, None, r"the expected name must be text, got int 5"),
    ("demo", "9" * 5000, r"the minimum release '9{20}.*' is not a release"),
])
def test_a_pin_of_another_type_or_past_the_digit_limit_is_refused_not_misread(name, release, message):
    """A float 1.10 read as release 1.1 let 1.9 pass; an int name and a 5,000-digit release raised a
    raw AttributeError and ValueError (found by an attack on the change)."""
    from precompile.signing.identity import expectations_for

    with pytest.raises(PrecompileError, match=message):
        expectations_for(name, release, argument="load(expect_name=, min_release=)")


def test_a_key_file_that_is_a_fifo_or_not_a_list_of_keys_is_refused_without_blocking(history):
    import os

    os.mkfifo("fifo.pub")
    with pytest.raises(PrecompileError, match=r"fifo\.pub is not a regular file"):
        read_trusted_keys(["fifo.pub"])
    from precompile.signing.pair import pins_for

    with pytest.raises(PrecompileError, match=r"trusted_keys=\.\.\.\) takes a public key file or PEM bytes, or a list of them, got int 5"):
        pins_for(5)


def test_sign_refuses_a_signature_path_that_is_a_file_of_the_pair(history):
    """`sign m.py m.sig` (the cache named as python_code's .sig) overwrote the cache with the envelope."""
    directory = history["v1"]
    shutil.copy(directory / "model.cache", directory / "model.sig")
    before = (directory / "model.sig").read_bytes()
    with pytest.raises(PrecompileError, match=r"model\.sig is a file of the pair itself"):
        sign_pair(directory / "model.py", directory / "model.sig", "release.key", name="demo", release="3")
    assert (directory / "model.sig").read_bytes() == before
