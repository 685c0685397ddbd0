"""The signing verbs of the `precompile` command: keygen and sign (with --name/--release, a DSSE
envelope of an in-toto statement that binds the release's identity).

`register(verbs)` adds them to the CLI's subparsers; they follow the inspect verbs' conventions:
data on stdout, diagnostics on stderr as `precompile: error: ...`, exit 0 (done), 1 (a finding: the
pair to sign fails verify) or 2 (trouble: a file or key is unusable, the sign extra is missing).
`precompile verify --trusted-key` checks signatures (see precompile.inspect.commands).
"""
from __future__ import annotations

import argparse

from precompile.inspect.commands import ARTIFACT_HELP, guarded
from precompile.inspect.render.terminal_text import printable

__all__ = ["register"]


def _keygen(args, out, err) -> int:
    from precompile.signing.keys import generate

    private, public, fingerprint = generate(args.out)
    out.print(f"wrote private key {private} (mode 0600: keep it with whoever signs releases)", markup=False)
    out.print(f"wrote public key  {public} (ship it to deployments: --trusted-key, trusted_keys=, PRECOMPILE_TRUSTED_KEYS)", markup=False)
    out.print(f"fingerprint {fingerprint}", markup=False)
    return 0


def _sign(args, out, err) -> int:
    import msgspec

    from precompile.inspect.reading.reader import open_artifact, resolve_pair
    from precompile.inspect.verify.verify import verify
    from precompile.signing.envelope import Signature
    from precompile.signing.pair import NO_IDENTITY, check_pair, describe, sign_pair

    python_code, cache = resolve_pair(args.artifact)
    failed = [c for c in verify(open_artifact(python_code, cache, deep=True), host=False).checks if c.status == "fail"]
    if failed:
        for check in failed:
            err.print(printable(f"precompile: error: {check.name}: {check.message}"), markup=False, highlight=False)
        err.print(f"precompile: error: not signing ({python_code}, {cache}): it fails verify (above); a signature vouches for a "
                  f"pair, so sign only one that verifies: `precompile verify {python_code} {cache}`", markup=False, highlight=False)
        return 1
    path, signature = sign_pair(python_code, cache, args.key, name=args.name, release=args.release)
    if args.json:
        out.file.write(msgspec.json.format(msgspec.json.encode(signature), indent=2).decode() + "\n")
        out.file.flush()
        return 0
    if isinstance(signature, Signature):
        out.print(f"signed {python_code} {cache} with key {signature.key}", markup=False)
        err.print(f"precompile: warning: {path} {NO_IDENTITY}: a deployment cannot tell this release from an older one or "
                  "from another model signed by the same key; pass --name NAME --release N", markup=False, highlight=False)
    else:
        identity = check_pair(python_code, cache, None).identity
        said = describe(identity) if identity is not None else "(unreadable)"
        out.print(f"signed {python_code} {cache} with key {signature.signatures[0].keyid} as {said}", markup=False)
    out.print(f"wrote {path}", markup=False)
    return 0


def register(verbs: argparse._SubParsersAction) -> None:
    """Add keygen and sign to the `precompile` command's subparsers."""
    keygen = verbs.add_parser("keygen", help="write a new release key pair: OUT.key (private, 0600) and OUT.pub",
                              description="write a new release key pair (ECDSA P-256, PEM): OUT.key (private, mode 0600) and OUT.pub")
    keygen.add_argument("--out", required=True, help="path prefix of the two key files, e.g. release")
    keygen.set_defaults(handler=guarded(_keygen))
    sign = verbs.add_parser("sign", help="sign a pair with a release key: writes NAME.sig beside NAME.py",
                            description="sign both files of a pair that verifies; writes NAME.sig beside python_code NAME.py")
    sign.add_argument("artifact", nargs="+", metavar="ARTIFACT", help=ARTIFACT_HELP)
    sign.add_argument("--key", required=True, help="the private key (PEM) `precompile keygen` wrote")
    sign.add_argument("--name", help=("the model's name, bound into the signature (a DSSE envelope of an in-toto statement): "
                                      "a deployment pins it with verify --expect-name, load(expect_name=), PRECOMPILE_EXPECT_NAME"))
    sign.add_argument("--release", metavar="N", help=(
        "the release, an integer or a PEP 440 version that grows with every release (10 > 9, 1.10 > 1.9): a deployment "
        "refuses older ones with verify --min-release, load(min_release=), PRECOMPILE_MIN_RELEASE. Without --name and "
        "--release the signature binds no identity (the first format)"))
    sign.add_argument("--json", action="store_true", help="print the signature file written instead of text")
    sign.set_defaults(handler=guarded(_sign))
