"""Mask the names Dynamo mints afresh in every process, so two captures of the same code compare equal.

Dynamo names each compiled graph `__compiled_fn_<n>_<uuid4>`, each continuation
`__resume_at_<offset>_<counter>` from a process-wide counter, and each global it installs for an
object by that object's id and the compile's (`_<id>_c<n>`: transformers' GPT-2 has Dynamo install
the torch module so, and guards on `G['_140291431376400_c0'].Tensor`); the opaque state pickles those names,
so its size and sha256 (in the comment above it) change with them. None of this says anything about
what was captured; `diff` and the snapshot tests compare text with it masked, through this one function.

The opaque state itself is compared through `opaque_fingerprint`: its pickle's opcode stream (nested
pickles followed) with those names, object ids, Dynamo's `__builtins_dict___<n>` counter and large
integers (guard hashes) masked. Read with `pickletools.genops` only; nothing is unpickled. A pickle
of more than MAX_OPS opcodes (nested ones included) has no fingerprint: its reader compares it whole.
"""
from __future__ import annotations

import hashlib
import pickletools
import re

_COMPILED_FN = re.compile(r"__compiled_fn_\d+_[0-9a-f_]{36}")
_RESUME_AT = re.compile(r"(__resume_at_\d+)_\d+")
_BUILTINS_DICT = re.compile(r"__builtins_dict___\d+")
_GLOBAL_BY_ID = re.compile(r"_\d{6,}_c\d+\b")
_OBJECT_ID = re.compile(r"\b\d{9,}\b")
_PICKLED = re.compile(r"pickled \(\d+ bytes, sha256 [0-9a-f]{64}\)")
_ARTIFACT_PREFIX = re.compile(r"__precompile_[0-9a-f]{12}_")
MAX_OPS = 2_000_000


class _TooManyOps(Exception):
    pass


def mask_process_ids(text: str) -> str:
    """`text` with every per-process graph uuid, continuation counter and opaque-state size and digest
    replaced by a placeholder."""
    if "__" not in text and "pickled (" not in text and "_c" not in text:  # what each spells: most text, at a glance
        return text
    text = _GLOBAL_BY_ID.sub("_<id>_c<n>", text)
    text = _COMPILED_FN.sub("__compiled_fn_<n>_<uuid>", text)
    text = _PICKLED.sub("pickled (<size>, <sha256>)", text)
    text = _BUILTINS_DICT.sub("__builtins_dict___<n>", text)
    return _RESUME_AT.sub(r"\1_<n>", text)


def mask_artifact_names(text: str) -> str:
    """`text` with the prefix each artifact gives the names it seeds (`__precompile_<12 hex>_`, drawn
    from its content) replaced by a placeholder: two releases of one model name the same things."""
    return _ARTIFACT_PREFIX.sub("__precompile_<artifact>_", text) if "__precompile_" in text else text


def _is_pickle(data: bytes | bytearray) -> bool:
    return len(data) >= 2 and data[0] == 0x80 and data[1] <= 5


def _masked_ops(data: bytes, digest, ops_left: list[int], depth: int = 0) -> None:
    for op, arg, _pos in pickletools.genops(data):
        ops_left[0] -= 1
        if ops_left[0] < 0:
            raise _TooManyOps
        if op.name in ("FRAME", "LONG1", "LONG4"):
            arg = None  # framing sizes, and the 64-bit guard hashes Dynamo computes per process
        elif isinstance(arg, (bytes, bytearray)) and _is_pickle(arg) and depth < 8:
            blob = bytes(arg)
            try:
                nested = hashlib.sha256()
                _masked_ops(blob, nested, ops_left, depth + 1)
                arg = nested.hexdigest()
            except _TooManyOps:
                raise
            except Exception:  # bytes that only look like a pickle are compared as bytes
                arg = _OBJECT_ID.sub("<id>", mask_process_ids(blob.decode("latin-1")))
        elif isinstance(arg, (bytes, bytearray)):
            arg = _OBJECT_ID.sub("<id>", mask_process_ids(bytes(arg).decode("latin-1")))
        elif isinstance(arg, str):
            arg = _OBJECT_ID.sub("<id>", mask_process_ids(arg))
        digest.update(f"{op.name} {arg!r}\n".encode("utf-8", "surrogatepass"))


def opaque_fingerprint(data: bytes) -> str | None:
    """A digest of a pickle with everything a process mints masked, or None when it is not a pickle
    (or one of more than MAX_OPS opcodes)."""
    if not _is_pickle(data):
        return None
    digest = hashlib.sha256()
    try:
        _masked_ops(data, digest, [MAX_OPS])
    except Exception:  # malformed: genops raises ValueError, EOFError, ...
        return None
    return digest.hexdigest()
