"""Signed pairs: who made a pair, not only that it is whole.

`precompile keygen` writes a release key pair; `precompile sign PAIR --key release.key` writes
`<stem>.sig` beside python_code `<stem>.py`; `precompile verify PAIR --trusted-key release.pub` and
`precompile.load(..., trusted_keys=[...])` (or PRECOMPILE_TRUSTED_KEYS, which a deployment pins)
refuse a pair none of the trusted keys signed, before anything of it is executed or primed.

What is signed: `precompile sign --name NAME --release N` writes a DSSE envelope (`dsse`) of an
in-toto Statement v1 (`statement`): its subjects are both files (sha256, role, size), its predicate
the release's identity (name, release, when it was signed, and the capture's function, backend,
tracer and torch build). A deployment pins the identity (`identity`: verify --expect-name/
--min-release, load(expect_name=, min_release=), PRECOMPILE_EXPECT_NAME / PRECOMPILE_MIN_RELEASE), so
another model or an older release signed by the same key is refused. Without --name/--release, sign
writes the first format (`envelope.statement`: the format tag, then each role's sha256 and size),
which is still read and binds no identity: an expectation refuses it. Either way, changing either
file, swapping them, or pairing the python_code with another cache voids the signature; renaming the
pair together with its .sig does not.
A signature always covers both files, and a signed pair is used only whole: if the cache is missing,
load refuses rather than degrading to python_code alone (which load otherwise may, the cache being an
acceleration), so deleting a file can neither turn a shipped pair into a JIT-compiling one nor slip
an unsigned cache in.

Why not OpenSSF model-signing (evaluated at 1.1.1): its key-based signer works offline, but it signs
a path (one file, or a whole directory tree), not a list of files: signing a pair means signing its
directory, which then fails verification as soon as any other file (another pair, the .sig itself)
sits there, and ties the signature to file names; the pair's roles and the file list are reachable
only through private modules. It also pulls in sigstore, tuf, pydantic and requests (33
distributions, 94 MB; importing it loads 631 modules), and 1.1.1 fails to import from a clean
install (it imports OpenSSL without declaring pyOpenSSL). So signing uses `cryptography` directly (what
model-signing itself uses for keys), with the same key kinds (ECDSA P-256/384/521 PEM): the `sign`
extra. Everything here is torch-free; without the extra, signing and checking raise a PrecompileError
naming it, while telling whether a pair is signed needs only msgspec.
"""
from __future__ import annotations

from precompile.signing.envelope import FORMAT, FileDigest, Signature, signature_path
from precompile.signing.identity import EXPECT_NAME_ENV, MIN_RELEASE_ENV, Expectation, expectation, expectations_for
from precompile.signing.keys import EXTRA, Key, generate
from precompile.signing.pair import (
    TRUSTED_KEYS_ENV,
    Verdict,
    check_pair,
    pins_for,
    read_trusted_keys,
    require_trusted,
    sign_pair,
    trusted_keys_from_environment,
)

__all__ = [
    "EXPECT_NAME_ENV", "EXTRA", "FORMAT", "MIN_RELEASE_ENV", "TRUSTED_KEYS_ENV", "Expectation", "FileDigest", "Key", "Signature",
    "Verdict", "check_pair", "expectation", "expectations_for", "generate",
    "pins_for", "read_trusted_keys", "require_trusted", "sign_pair", "signature_path", "trusted_keys_from_environment",
]
