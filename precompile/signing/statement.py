"""The signed statement of a pair: an in-toto Statement v1 naming both files and the release they are.

Its subjects are the two files (sha256, and their role and size as annotations); its predicate
(`PREDICATE_TYPE`) binds the identity a deployment pins, the release's name and number, and records
when it was signed and what capture made it. Torch-free and crypto-free: the capture's facts are read
from python_code's metadata literals.
Spec: https://github.com/in-toto/attestation (spec/v1: statement.md, resource_descriptor.md).
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Literal

import msgspec

from precompile.errors import PrecompileError
from precompile.signing.envelope import FileDigest

__all__ = ["PAYLOAD_TYPE", "PREDICATE_TYPE", "STATEMENT_TYPE", "CaptureFacts", "PairIdentity", "Statement", "Subject",
           "capture_facts", "decode_statement", "encode_statement", "now_utc"]

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://precompile.dev/signed-pair/v1"
"""Ours: a later incompatible predicate gets /v2."""
Role = Literal["python_code", "cache"]


class SubjectAnnotations(msgspec.Struct, frozen=True, kw_only=True):
    role: Role
    """Which file of the pair: roles, not names, are checked, so renaming a pair with its .sig keeps it signed."""
    size: int


class Subject(msgspec.Struct, frozen=True, kw_only=True):
    """An in-toto ResourceDescriptor: the file's name when it was signed, its digest, its role and size."""

    name: str
    digest: dict[str, str]
    annotations: SubjectAnnotations


class CaptureFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What capture made the pair, as its python_code states it."""

    fn: str
    backend: str
    tracer: str
    torch: str


class PairIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """The predicate: which release of which model the pair is, when it was signed, and what captured it."""

    name: str
    release: str
    """A PEP 440 version (an integer is one): releases of a name only grow (precompile.signing.release)."""
    created: str
    """When it was signed, UTC, RFC 3339 (2026-12-04T03:40:00Z)."""
    capture: CaptureFacts


class Statement(msgspec.Struct, frozen=True, kw_only=True):
    type: str = msgspec.field(name="_type")
    subject: tuple[Subject, ...]
    predicateType: str
    predicate: PairIdentity


def now_utc() -> str:
    """The time now, UTC, RFC 3339 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def capture_facts(python_code: Path) -> CaptureFacts:
    """The capture's function, backend, tracer and torch build, read from python_code's metadata literals."""
    from precompile.artifact.pair import read_python_code

    code = read_python_code(python_code)
    metadata = code.metadata
    return CaptureFacts(fn=metadata.fn_name, backend=metadata.backend, tracer=code.header.tracer, torch=metadata.torch_version)


def encode_statement(files: dict[Role, tuple[Path, FileDigest]], identity: PairIdentity) -> bytes:
    subjects = tuple(Subject(name=path.name, digest={"sha256": digest.sha256}, annotations=SubjectAnnotations(role=role, size=digest.size))
                     for role, (path, digest) in files.items())
    return msgspec.json.encode(Statement(type=STATEMENT_TYPE, subject=subjects, predicateType=PREDICATE_TYPE, predicate=identity))


def decode_statement(payload: bytes, source: os.PathLike[str] | str) -> tuple[dict[str, FileDigest], PairIdentity]:
    """Each role's digest and the identity a statement signs; one that is not ours is a PrecompileError."""
    try:
        statement = msgspec.json.decode(payload, type=Statement)
    except msgspec.DecodeError as exc:
        raise PrecompileError(f"signature {source} holds a payload that is not a precompile in-toto statement ({exc}); "
                              "sign the pair again with `precompile sign --name --release`") from None
    if statement.type != STATEMENT_TYPE or statement.predicateType != PREDICATE_TYPE:
        raise PrecompileError(f"signature {source} holds a statement of type {statement.type!r} with predicate "
                              f"{statement.predicateType!r}, expected {STATEMENT_TYPE!r} with {PREDICATE_TYPE!r}; "
                              "sign the pair again with `precompile sign --name --release`")
    digests: dict[str, FileDigest] = {s.annotations.role: FileDigest(sha256=s.digest.get("sha256", ""), size=s.annotations.size) for s in statement.subject}
    if sorted(s.annotations.role for s in statement.subject) != ["cache", "python_code"]:
        raise PrecompileError(f"signature {source} names subjects {[s.annotations.role for s in statement.subject]}, expected "
                              "one python_code and one cache; sign the pair again with `precompile sign --name --release`")
    return digests, statement.predicate
