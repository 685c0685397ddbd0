"""Release keys: generate them, read them, fingerprint them, sign and verify bytes with them.

The only module that imports `cryptography`, and only when called: it comes with the `sign` extra.
Keys are ECDSA on the NIST curves OpenSSF model-signing's key-based signer uses (P-256, P-384, P-521,
hashed with SHA-256/384/512), as PEM: PKCS#8 private keys, SubjectPublicKeyInfo public keys. So a
team's model-signing key pair signs precompile pairs too, and `keygen` writes P-256.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from precompile.artifact.pair import read_bytes
from precompile.errors import PrecompileError

__all__ = ["EXTRA", "Key", "generate", "read_private_key", "read_public_key", "sign", "verify"]

EXTRA = "pip install 'precompile[sign]'"
_HASHES = {"secp256r1": "SHA256", "secp384r1": "SHA384", "secp521r1": "SHA512"}
MAX_KEY_SIZE = 64 * 1024


def _cryptography() -> Any:
    try:
        import cryptography.exceptions
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as exc:
        raise PrecompileError(
            f"signing and checking signatures need the cryptography package, which cannot be imported here ({exc}); "
            f"install the extra: {EXTRA}"
        ) from None
    return cryptography.exceptions, hashes, serialization, ec


@dataclass(frozen=True)
class Key:
    """A loaded key (a trusted public key, or the private key that signs), its fingerprint, and where
    it came from (for messages). The fingerprint is always the public half's."""

    fingerprint: str
    source: str
    key: Any


def _fingerprint(public_key: Any) -> str:
    _, _, serialization, _ = _cryptography()
    der = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return "SHA256:" + hashlib.sha256(der).hexdigest()


def _supported(key: Any, source: str) -> None:
    _, _, _, ec = _cryptography()
    if not isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)):
        raise PrecompileError(f"key {source} is of type {type(key).__name__.lstrip('_')}, expected an ECDSA key on one of "
                              f"{', '.join(_HASHES)}; make one with `precompile keygen`")
    if key.curve.name not in _HASHES:
        raise PrecompileError(f"key {source} is on curve {key.curve.name}, expected one of {', '.join(_HASHES)}; "
                              "make one with `precompile keygen`")


def _read(path: Path, what: str) -> bytes:
    """A key file's bytes, read as every artifact file is: a regular file only (a FIFO or device is
    refused without blocking), within MAX_KEY_SIZE."""
    if not os.path.lexists(path):
        raise PrecompileError(f"{what} {path} does not exist; pass the PEM file `precompile keygen` wrote")
    return read_bytes(path, what, MAX_KEY_SIZE)


def read_public_key(given: str | os.PathLike[str] | bytes) -> Key:
    """A trusted public key from a PEM file's path, or from PEM bytes."""
    _, _, serialization, _ = _cryptography()
    if isinstance(given, bytes):
        data, source = given, "(PEM bytes)"
    elif isinstance(given, str) and given.lstrip().startswith("-----BEGIN"):
        raise PrecompileError("a trusted key was given as a str of PEM text, where a str is a path; pass the PEM as bytes "
                              "(text.encode()) or the path of the .pub file")
    else:
        data, source = _read(Path(given), "public key"), os.fspath(given)
    if b"PRIVATE KEY-----" in data:
        raise PrecompileError(f"key {source} is a private key, expected a public key; trust the .pub `precompile keygen` "
                              "wrote beside it, and keep the private key with whoever signs releases")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise PrecompileError(f"key {source} is not a PEM public key ({exc}); pass the .pub `precompile keygen` wrote") from None
    _supported(key, source)
    return Key(fingerprint=_fingerprint(key), source=source, key=key)


def read_private_key(path: str | os.PathLike[str]) -> Key:
    """The release key to sign with, from an unencrypted PEM (PKCS#8 or traditional) file."""
    _, _, serialization, _ = _cryptography()
    source = os.fspath(path)
    data = _read(Path(path), "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise PrecompileError(f"private key {source} is encrypted; precompile signs with an unencrypted PEM key "
                              "(keep it 0600 or in a secret store; `openssl pkey -in KEY -out PLAIN` decrypts one)") from None
    except ValueError as exc:
        raise PrecompileError(f"key {source} is not a PEM private key ({exc}); pass the .key `precompile keygen` wrote") from None
    _supported(key, source)
    return Key(fingerprint=_fingerprint(key.public_key()), source=source, key=key)


def generate(out: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """Write a new P-256 key pair: OUT.key (private, mode 0600) and OUT.pub; never over existing files.
    Returns both paths and the key's fingerprint."""
    _, _, serialization, ec = _cryptography()
    private_path, public_path = Path(f"{os.fspath(out)}.key"), Path(f"{os.fspath(out)}.pub")
    for path in (private_path, public_path):
        if path.exists():
            raise PrecompileError(f"{path} exists; keygen never overwrites a key: choose another --out, or move it away first")
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    for path, data, mode in ((private_path, private, 0o600), (public_path, public, 0o644)):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            raise PrecompileError(f"could not write key {path}: {exc.strerror or exc}") from None
    return private_path, public_path, _fingerprint(key.public_key())


def sign(key: Key, data: bytes) -> str:
    """Base64 of the DER ECDSA signature of `data`."""
    _, hashes, _, ec = _cryptography()
    algorithm = getattr(hashes, _HASHES[key.key.curve.name])()
    return base64.b64encode(key.key.sign(data, ec.ECDSA(algorithm))).decode("ascii")


def verify(key: Key, signature: str, data: bytes) -> bool:
    """Whether `signature` (base64 DER ECDSA) is `key`'s over `data`."""
    exceptions, hashes, _, ec = _cryptography()
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    algorithm = getattr(hashes, _HASHES[key.key.curve.name])()
    try:
        key.key.verify(raw, data, ec.ECDSA(algorithm))
    except exceptions.InvalidSignature:
        return False
    return True
