"""DSSE, the signing envelope in-toto and Sigstore use: its JSON form and the bytes a key signs.

A key signs PAE(payloadType, payload), DSSE's pre-authentication encoding, never the payload alone,
so a signature over one payload type cannot be replayed as another. The envelope's `keyid` is a hint
for messages only (the DSSE protocol forbids deciding on it): a verifier tries each trusted key.
Spec: https://github.com/secure-systems-lab/dsse (protocol.md, envelope.md), version 1.0.
Torch-free and crypto-free.
"""
from __future__ import annotations

import base64
import binascii

import msgspec

__all__ = ["DsseEnvelope", "DsseSignature", "decode_payload", "encode_payload", "pae"]


class DsseSignature(msgspec.Struct, frozen=True, kw_only=True):
    """One signature of an envelope: base64 of the signature bytes, and the signing key's id (a hint)."""

    keyid: str = ""
    sig: str


class DsseEnvelope(msgspec.Struct, frozen=True, kw_only=True):
    """DSSE's JSON envelope. Fields a later producer adds are ignored, as the spec asks."""

    payload: str
    """Base64 of the serialized body (standard or URL-safe alphabet, padded or not)."""
    payloadType: str
    signatures: tuple[DsseSignature, ...]


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: "DSSEv1", then the type and the body, each preceded by its
    length in bytes as ASCII decimal, separated by single spaces."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def encode_payload(payload: bytes) -> str:
    """The envelope's `payload`: standard base64, padded."""
    return base64.b64encode(payload).decode("ascii")


def decode_payload(text: str) -> bytes | None:
    """The bytes of an envelope's base64 `payload` in either alphabet, padded or not; None if it is not base64."""
    padded = text + "=" * (-len(text) % 4)
    try:
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None
