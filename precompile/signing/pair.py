"""Signed pairs: sign a pair, check one against trusted keys, and the rule load() applies.

A signature covers the pair exactly as present: python_code's bytes and the cache's bytes. A pair
whose cache is missing is refused, not loaded from python_code alone (see `precompile.signing`).
"""
from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union

from precompile.errors import PrecompileError
from precompile.signing.dsse import DsseEnvelope, DsseSignature, decode_payload, encode_payload, pae
from precompile.signing.envelope import (
    FileDigest,
    Signature,
    digest_bytes,
    digest_file,
    read_signature,
    signature_path,
    statement,
    write_signature,
)
from precompile.signing.identity import Expectation, identity_problem
from precompile.signing.identity import release as parse_release
from precompile.signing.keys import Key, read_private_key, read_public_key, sign, verify
from precompile.signing.statement import (
    PAYLOAD_TYPE,
    PairIdentity,
    Role,
    capture_facts,
    decode_statement,
    encode_statement,
    now_utc,
)

__all__ = ["TRUSTED_KEYS_ENV", "KeySource", "TrustedKeys", "Verdict", "check_pair", "read_trusted_keys", "require_trusted", "sign_pair",
           "trusted_keys_from_environment"]

TRUSTED_KEYS_ENV = "PRECOMPILE_TRUSTED_KEYS"
"""Public key paths, os.pathsep-separated: when set, load() refuses any pair none of them signed."""

KeySource = Union[str, os.PathLike, bytes]
"""A trusted public key: a PEM file's path, or PEM bytes."""
TrustedKeys = Union[KeySource, Iterable[KeySource]]
"""What load(trusted_keys=) takes: one key, or several."""

NO_IDENTITY = "binds no identity (no name or release)"
_TAMPERED = "treat the pair as tampered: restore the files the release shipped, or have the release key sign it again"


@dataclass(frozen=True)
class Verdict:
    """What checking a pair's signature found; shaped like a verify check."""

    status: Literal["ok", "fail", "skip"]
    message: str
    expected: str | None = None
    actual: str | None = None
    remedy: str | None = None
    signer: str | None = None
    """The fingerprint of the key that signed the pair, once its signature verified."""
    identity: PairIdentity | None = None
    """The release the pair is signed as (None for a signature that binds none: the first format)."""


def _one_of(keys: Iterable[Key]) -> str:
    return "a signature by one of " + ", ".join(f"{key.fingerprint} ({key.source})" for key in keys)


def describe(identity: PairIdentity) -> str:
    """A signed identity in one line: name, release, when, and what captured it."""
    capture = identity.capture
    return (f"name {identity.name!r}, release {identity.release}, created {identity.created} "
            f"(fn {capture.fn}, backend {capture.backend}, tracer {capture.tracer}, torch {capture.torch})")


def _digests(python_code: Path, cache: Path) -> dict[Role, tuple[Path, FileDigest]]:
    found: dict[Role, tuple[Path, FileDigest]] = {}
    roles: tuple[tuple[Role, Path], ...] = (("python_code", python_code), ("cache", cache))
    for role, path in roles:
        digest = digest_file(path, role)
        if digest is None:
            raise PrecompileError(f"{role} {path} does not exist; a signature covers both files of a pair: pass the pair capture() wrote")
        found[role] = (path, digest)
    return found


def sign_pair(python_code: str | os.PathLike[str], cache: str | os.PathLike[str], key: str | os.PathLike[str], *,
              name: str | None = None, release: str | int | None = None) -> tuple[Path, Signature | DsseEnvelope]:
    """Sign both files of a pair with the private key at `key`; write `<stem>.sig` beside python_code.

    With `name` and `release`: a DSSE envelope of an in-toto statement binding the files to that
    identity (precompile.signing.statement). Without: the first format, which binds no identity."""
    if (name is None) != (release is None):
        raise PrecompileError("a signed identity is a name and a release: pass both (--name NAME --release N), or neither "
                              "for a signature that binds no identity")
    if name is not None and (not name.strip() or any(ch in name for ch in "\n\r\t")):
        raise PrecompileError(f"--name {name!r} is not a release name: pass the model's name, one line of text")
    signed_release = None if release is None else str(parse_release(str(release), "--release"))
    signing_key = read_private_key(key)
    path = signature_path(python_code)
    if os.path.exists(path) and any(os.path.exists(given) and os.path.samefile(path, given) for given in (python_code, cache)):
        raise PrecompileError(f"the signature's path {path} is a file of the pair itself; rename the pair so that "
                              "python_code's NAME.sig is neither file, then sign it")
    files = _digests(Path(python_code), Path(cache))
    if name is None or signed_release is None:
        code, cached = files["python_code"][1], files["cache"][1]
        legacy = Signature(python_code=code, cache=cached, key=signing_key.fingerprint, signature=sign(signing_key, statement(code, cached)))
        write_signature(path, legacy)
        return path, legacy
    identity = PairIdentity(name=name, release=signed_release, created=now_utc(),
                            capture=capture_facts(Path(python_code)))
    payload = encode_statement(files, identity)
    envelope = DsseEnvelope(payload=encode_payload(payload), payloadType=PAYLOAD_TYPE, signatures=(
        DsseSignature(keyid=signing_key.fingerprint, sig=sign(signing_key, pae(PAYLOAD_TYPE, payload))),))
    write_signature(path, envelope)
    return path, envelope


@dataclass(frozen=True)
class _Signed:
    """A signature that verified: its key, the digests it covers, the identity it binds (if any)."""

    key: Key
    files: dict[str, FileDigest]
    identity: PairIdentity | None


def _unverified_identity(envelope: DsseEnvelope, sig_path: Path) -> PairIdentity | None:
    payload = decode_payload(envelope.payload)
    try:
        return None if payload is None else decode_statement(payload, sig_path)[1]
    except PrecompileError:
        return None


def _unchecked(signature: Signature | DsseEnvelope, sig_path: Path) -> Verdict:
    if isinstance(signature, Signature):
        return Verdict(status="skip", message=f"present, not checked: {sig_path} names key {signature.key} and {NO_IDENTITY}; "
                                              "`precompile verify --trusted-key` checks it")
    identity = _unverified_identity(signature, sig_path)
    keys = ", ".join(s.keyid or "(no key id)" for s in signature.signatures)
    said = f"says {describe(identity)}" if identity is not None else "holds no readable statement"
    return Verdict(status="skip", message=f"present, not checked: {sig_path} (a DSSE in-toto statement) {said}, signed by key {keys}; "
                                          "`precompile verify --trusted-key` checks it", identity=identity)


def _dsse_signer(envelope: DsseEnvelope, payload: bytes, trusted: Sequence[Key], sig_path: Path) -> _Signed | Verdict | None:
    """The first trusted key whose signature over PAE(payloadType, payload) verifies (the envelope's key
    ids are hints, never trusted), with the statement it signs; None when no trusted key signed it."""
    signed = pae(envelope.payloadType, payload)
    for candidate in trusted:
        for entry in envelope.signatures:
            raw = decode_payload(entry.sig)
            if raw is None or not verify(candidate, base64.b64encode(raw).decode("ascii"), signed):
                continue
            try:
                files, identity = decode_statement(payload, sig_path)
            except PrecompileError as exc:
                return Verdict(status="fail", message=str(exc), expected="a precompile in-toto statement", actual="another statement",
                               remedy="sign the pair again with `precompile sign --name --release`")
            return _Signed(key=candidate, files=files, identity=identity)
    return None


def _verified(signature: Signature | DsseEnvelope, trusted: Sequence[Key], sig_path: Path) -> _Signed | Verdict:
    """The signature checked against the trusted keys: what it covers, or the failing verdict."""
    if isinstance(signature, Signature):
        named = [signature.key]
        key = {k.fingerprint: k for k in trusted}.get(signature.key)
        if key is not None and verify(key, signature.signature, statement(signature.python_code, signature.cache)):
            return _Signed(key=key, files={"python_code": signature.python_code, "cache": signature.cache}, identity=None)
    else:
        if signature.payloadType != PAYLOAD_TYPE:
            return Verdict(status="fail", message=f"{sig_path} is a DSSE envelope of payload type {signature.payloadType!r}, not an "
                                                  f"in-toto statement ({PAYLOAD_TYPE!r})", expected=PAYLOAD_TYPE,
                           actual=signature.payloadType, remedy="sign the pair again with `precompile sign --name --release`")
        payload = decode_payload(signature.payload)
        named = [s.keyid for s in signature.signatures]
        found = _dsse_signer(signature, payload, trusted, sig_path) if payload is not None else None
        if found is not None:
            return found
    trusted_ids = {k.fingerprint for k in trusted}
    if not trusted_ids.intersection(named):
        return Verdict(status="fail", message=f"{sig_path} is signed by key {', '.join(named)}, which is not trusted",
                       expected=_one_of(trusted), actual=f"a signature by {', '.join(named)}",
                       remedy="trust that key's public half only if it is a release key (--trusted-key, trusted_keys=, "
                              f"{TRUSTED_KEYS_ENV}); otherwise have the release key sign the pair")
    return Verdict(status="fail", message=f"{sig_path} names key {', '.join(named)} but its signature does not verify with that key: "
                                          "the signature file was altered or forged",
                   expected=_one_of(trusted), actual="an invalid signature", remedy=_TAMPERED)


def check_pair(python_code: str | os.PathLike[str], cache: str | os.PathLike[str], trusted: Sequence[Key] | None, *,
               contents: tuple[bytes, bytes | None] | None = None, expect: Sequence[Expectation] = ()) -> Verdict:
    """Whether one of `trusted` signed the pair as it is now, or, given `contents` (python_code's and the
    cache's bytes as a reader already holds them, None for a cache it could not read), those bytes,
    and signed it as the identity every one of `expect` pins. Without trusted keys, nothing is checked:
    the verdict (a skip) only says whether the pair carries a signature, and what it says."""
    code_path, cache_path = Path(python_code), Path(cache)
    sig_path = signature_path(code_path)
    if expect and trusted is None:
        return Verdict(status="fail", message=f"an expected name or minimum release ({expect[0].source}) is checked on a signature, "
                                              "but no key is trusted to check it with", expected="a trusted key", actual="none",
                       remedy=f"pass --trusted-key (trusted_keys=, {TRUSTED_KEYS_ENV}) with the release key's public half")
    try:
        signature = read_signature(sig_path)
    except PrecompileError as exc:
        if trusted is None:
            return Verdict(status="skip", message=f"present, not checked, and unreadable: {exc}")
        return Verdict(status="fail", message=str(exc), expected=_one_of(trusted), actual=f"an unusable {sig_path}",
                       remedy="get the pair again from the release, or have the release key sign it again")
    if trusted is None:
        if signature is None:
            return Verdict(status="skip", message=f"unsigned: no signature file {sig_path}")
        return _unchecked(signature, sig_path)
    if signature is None:
        return Verdict(status="fail", message=f"unsigned: there is no signature file {sig_path}",
                       expected=_one_of(trusted), actual="no signature",
                       remedy=f"have the release key's holder sign it: precompile sign {code_path} {cache_path} --key RELEASE.key "
                              "--name NAME --release N")
    signed = _verified(signature, trusted, sig_path)
    if isinstance(signed, Verdict):
        return signed
    for index, (what, path) in enumerate((("python_code", code_path), ("cache", cache_path))):
        found = digest_file(path, what) if contents is None else digest_bytes(contents[index])
        covered = f"sha256 {signed.files[what].sha256}, {signed.files[what].size} bytes"
        if found is None:
            return Verdict(status="fail", message=f"{what} {path} does not exist, but {sig_path} covers one: a signed pair is used only as "
                                                  "signed, both files (a cache is never dropped to load python_code alone)",
                           expected=covered, actual="no file",
                           remedy=f"restore the {what} the release shipped beside {code_path}, or have the release key sign the pair again")
        if found != signed.files[what]:
            return Verdict(status="fail", message=f"{what} {path} is not the file {sig_path} covers: it changed after the pair was signed",
                           expected=covered, actual=f"sha256 {found.sha256}, {found.size} bytes", remedy=_TAMPERED)
    return _identity_verdict(signed, expect, sig_path)


def _identity_verdict(signed: _Signed, expect: Sequence[Expectation], sig_path: Path) -> Verdict:
    key = signed.key
    by = f"signed by key {key.fingerprint} ({key.source})"
    if signed.identity is None:
        if expect:
            wanted = _wanted(expect)
            return Verdict(status="fail", message=f"{sig_path} is {by} in the first signature format, which {NO_IDENTITY}, so "
                                                  f"{expect[0].source} cannot be checked", expected=wanted,
                           actual="a signature that binds no identity", signer=key.fingerprint,
                           remedy="have the release key sign the pair again with its identity: precompile sign PAIR --key RELEASE.key "
                                  "--name NAME --release N")
        return Verdict(status="ok", message=f"{by}; it {NO_IDENTITY} (first format): re-sign with --name/--release so that a "
                                            "rollback or another model signed by the same key is refused",
                       actual=key.fingerprint, signer=key.fingerprint)
    for expectation in expect:
        problem = identity_problem(signed.identity, expectation)
        if problem is not None:
            return Verdict(status="fail", message=f"{sig_path}: {problem}", expected=_wanted([expectation]),
                           actual=f"name {signed.identity.name!r}, release {signed.identity.release}", signer=key.fingerprint,
                           identity=signed.identity,
                           remedy="deploy the pair of the expected name at or above the minimum release (the release ships "
                                  "it with its .sig); lower the pin only if this release is meant to serve")
    return Verdict(status="ok", message=f"{by}: {describe(signed.identity)}", actual=key.fingerprint, signer=key.fingerprint,
                   identity=signed.identity)


def _wanted(expect: Sequence[Expectation]) -> str:
    parts = []
    for expectation in expect:
        pins = [f"name {expectation.name!r}"] if expectation.name is not None else []
        pins += [f"release >= {expectation.min_release}"] if expectation.min_release is not None else []
        parts.append(f"{' and '.join(pins)} ({expectation.source})")
    return "; ".join(parts)


def read_trusted_keys(given: TrustedKeys) -> tuple[Key, ...]:
    """Trusted public keys from PEM paths or PEM bytes (one, or several); none at all is a PrecompileError."""
    items = [given] if isinstance(given, (str, bytes, os.PathLike)) else list(given)
    if not items:
        raise PrecompileError("trusted_keys is empty, so no pair could ever be trusted; pass at least one public key "
                              "(a PEM path or PEM bytes), or None to load without checking signatures")
    return tuple(read_public_key(item) for item in items)


def trusted_keys_from_environment() -> tuple[Key, ...] | None:
    """The keys PRECOMPILE_TRUSTED_KEYS pins, or None when it is unset. Set but naming no key is an
    error, not "unset": a pin that expanded to nothing must not quietly let unsigned pairs load."""
    value = os.environ.get(TRUSTED_KEYS_ENV)
    if value is None:
        return None
    paths = [part for part in value.split(os.pathsep) if part.strip()]
    if not paths:
        raise PrecompileError(f"{TRUSTED_KEYS_ENV} is set but names no key ({value!r}); set it to public key paths separated by "
                              f"{os.pathsep!r}, or unset it to load pairs without checking signatures")
    try:
        return tuple(read_public_key(path) for path in paths)
    except PrecompileError as exc:
        raise PrecompileError(f"{TRUSTED_KEYS_ENV}: {exc}") from None


Pins = list[tuple[str, tuple[Key, ...]]]
"""Who pins trusted keys (load's argument, the environment) and the keys each trusts."""


def pins_for(trusted_keys: TrustedKeys | None) -> Pins:
    """The keys load must find a pair signed by: `trusted_keys` and PRECOMPILE_TRUSTED_KEYS, each a pin
    of its own (neither loosens the other); [] when neither is set."""
    pins = []
    if trusted_keys is not None and not isinstance(trusted_keys, (str, bytes, os.PathLike)) and not hasattr(trusted_keys, "__iter__"):
        raise PrecompileError(f"load(trusted_keys=...) takes a public key file or PEM bytes, or a list of them, got "
                              f"{type(trusted_keys).__name__} {trusted_keys!r}"[:300])
    if trusted_keys is not None:
        pins.append(("load(trusted_keys=...)", read_trusted_keys(trusted_keys)))
    pinned = trusted_keys_from_environment()
    if pinned is not None:
        pins.append((TRUSTED_KEYS_ENV, pinned))
    return pins


def require_trusted(artifact_path: str | os.PathLike[str], cache_path: str | os.PathLike[str], pins: Pins,
                    contents: tuple[bytes, bytes | None], expect: Sequence[Expectation] = ()) -> None:
    """load()'s rule, checked on the bytes load read before any of them is parsed, primed or
    executed: the pair must be signed by a key every pin trusts, as the identity every one of
    `expect` pins (its name, at least its minimum release), else a PrecompileError."""
    refusing = f"refusing to load the pair ({artifact_path}, {cache_path})"
    trusted = [key for _, keys in pins for key in keys] if pins else None
    verdict = check_pair(artifact_path, cache_path, trusted, contents=contents, expect=expect)
    if verdict.status != "ok":
        raise PrecompileError(f"{refusing}: {verdict.message}; expected {verdict.expected}, found {verdict.actual}; remedy: {verdict.remedy}")
    for source, keys in pins:
        if verdict.signer not in {key.fingerprint for key in keys}:
            raise PrecompileError(f"{refusing}: it is signed by key {verdict.signer}, which {source} does not trust; expected "
                                  f"{_one_of(keys)}, found a signature by {verdict.signer}; remedy: have a key {source} trusts sign "
                                  f"the pair, or trust {verdict.signer} there too")
