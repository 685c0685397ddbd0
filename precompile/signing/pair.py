"""Signed pairs: sign a pair, check one against trusted keys, and the rule load() applies.

A signature covers the pair exactly as present: python_code's bytes and the cache's bytes. A pair
whose cache is missing is refused, not loaded from python_code alone (see `precompile.signing`).
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Union

from precompile.errors import PrecompileError
from precompile.signing.envelope import (
    Signature,
    digest_bytes,
    digest_file,
    read_signature,
    signature_path,
    statement,
    write_signature,
)
from precompile.signing.keys import Key, read_private_key, read_public_key, sign, verify

__all__ = ["TRUSTED_KEYS_ENV", "KeySource", "TrustedKeys", "Verdict", "check_pair", "read_trusted_keys", "require_trusted", "sign_pair",
           "trusted_keys_from_environment"]

TRUSTED_KEYS_ENV = "PRECOMPILE_TRUSTED_KEYS"
"""Public key paths, os.pathsep-separated: when set, load() refuses any pair none of them signed."""

KeySource = Union[str, os.PathLike, bytes]
"""A trusted public key: a PEM file's path, or PEM bytes."""
TrustedKeys = Union[KeySource, Iterable[KeySource]]
"""What load(trusted_keys=) takes: one key, or several."""

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


def _one_of(keys: Iterable[Key]) -> str:
    return "a signature by one of " + ", ".join(f"{key.fingerprint} ({key.source})" for key in keys)


def sign_pair(python_code: str | os.PathLike[str], cache: str | os.PathLike[str], key: str | os.PathLike[str]) -> tuple[Path, Signature]:
    """Sign both files of a pair with the private key at `key`; write `<stem>.sig` beside python_code."""
    signing_key = read_private_key(key)
    digests = []
    for what, path in (("python_code", Path(python_code)), ("cache", Path(cache))):
        digest = digest_file(path, what)
        if digest is None:
            raise PrecompileError(f"{what} {path} does not exist; a signature covers both files of a pair: pass the pair capture() wrote")
        digests.append(digest)
    code, cached = digests
    signature = Signature(python_code=code, cache=cached, key=signing_key.fingerprint, signature=sign(signing_key, statement(code, cached)))
    path = signature_path(python_code)
    write_signature(path, signature)
    return path, signature


def check_pair(python_code: str | os.PathLike[str], cache: str | os.PathLike[str], trusted: Sequence[Key] | None, *,
               contents: tuple[bytes, bytes | None] | None = None) -> Verdict:
    """Whether one of `trusted` signed the pair as it is now, or, given `contents` (python_code's and the
    cache's bytes as a reader already holds them, None for a cache it could not read), those bytes.
    Without trusted keys, nothing is checked: the verdict (a skip) only says whether the pair carries a
    signature."""
    code_path, cache_path = Path(python_code), Path(cache)
    sig_path = signature_path(code_path)
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
        return Verdict(status="skip", message=f"present, not checked: {sig_path} names key {signature.key}; pass --trusted-key to check it")
    if signature is None:
        return Verdict(status="fail", message=f"unsigned: there is no signature file {sig_path}",
                       expected=_one_of(trusted), actual="no signature",
                       remedy=f"have the release key's holder sign it: precompile sign {code_path} {cache_path} --key RELEASE.key")
    key = {k.fingerprint: k for k in trusted}.get(signature.key)
    if key is None:
        return Verdict(status="fail", message=f"{sig_path} is signed by key {signature.key}, which is not trusted",
                       expected=_one_of(trusted), actual=f"a signature by {signature.key}",
                       remedy="trust that key's public half only if it is a release key (--trusted-key, trusted_keys=, "
                              f"{TRUSTED_KEYS_ENV}); otherwise have the release key sign the pair")
    if not verify(key, signature.signature, statement(signature.python_code, signature.cache)):
        return Verdict(status="fail", message=f"{sig_path} names key {signature.key} but its signature does not verify with that key: "
                                              "the signature file was altered or forged",
                       expected=f"a valid signature by {key.fingerprint} ({key.source})", actual="an invalid signature", remedy=_TAMPERED)
    for index, (what, path, signed) in enumerate((("python_code", code_path, signature.python_code), ("cache", cache_path, signature.cache))):
        found = digest_file(path, what) if contents is None else digest_bytes(contents[index])
        covered = f"sha256 {signed.sha256}, {signed.size} bytes"
        if found is None:
            return Verdict(status="fail", message=f"{what} {path} does not exist, but {sig_path} covers one: a signed pair is used only as "
                                                  "signed, both files (a cache is never dropped to load python_code alone)",
                           expected=covered, actual="no file",
                           remedy=f"restore the {what} the release shipped beside {code_path}, or have the release key sign the pair again")
        if found != signed:
            return Verdict(status="fail", message=f"{what} {path} is not the file {sig_path} covers: it changed after the pair was signed",
                           expected=covered, actual=f"sha256 {found.sha256}, {found.size} bytes", remedy=_TAMPERED)
    return Verdict(status="ok", message=f"signed by key {key.fingerprint} ({key.source})", actual=key.fingerprint, signer=key.fingerprint)


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
    if trusted_keys is not None:
        pins.append(("load(trusted_keys=...)", read_trusted_keys(trusted_keys)))
    pinned = trusted_keys_from_environment()
    if pinned is not None:
        pins.append((TRUSTED_KEYS_ENV, pinned))
    return pins


def require_trusted(artifact_path: str | os.PathLike[str], cache_path: str | os.PathLike[str], pins: Pins,
                    contents: tuple[bytes, bytes | None]) -> None:
    """load()'s rule, checked on the bytes load read before any of them is parsed, primed or
    executed: the pair must be signed by a key every pin trusts, else a PrecompileError."""
    refusing = f"refusing to load the pair ({artifact_path}, {cache_path})"
    verdict = check_pair(artifact_path, cache_path, [key for _, keys in pins for key in keys], contents=contents)
    if verdict.status != "ok":
        raise PrecompileError(f"{refusing}: {verdict.message}; expected {verdict.expected}, found {verdict.actual}; remedy: {verdict.remedy}")
    for source, keys in pins:
        if verdict.signer not in {key.fingerprint for key in keys}:
            raise PrecompileError(f"{refusing}: it is signed by key {verdict.signer}, which {source} does not trust; expected "
                                  f"{_one_of(keys)}, found a signature by {verdict.signer}; remedy: have a key {source} trusts sign "
                                  f"the pair, or trust {verdict.signer} there too")
