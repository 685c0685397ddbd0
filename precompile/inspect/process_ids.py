"""Mask the names Dynamo mints afresh in every process, so two captures of the same code compare equal.

Dynamo names each compiled graph `__compiled_fn_<n>_<uuid4>` and each continuation
`__resume_at_<offset>_<counter>` from a process-wide counter. Neither says anything about what was
captured; `diff` and the snapshot tests compare text with them masked, through this one function.
"""
from __future__ import annotations

import re

_COMPILED_FN = re.compile(r"__compiled_fn_\d+_[0-9a-f_]{36}")
_RESUME_AT = re.compile(r"(__resume_at_\d+)_\d+")


def mask_process_ids(text: str) -> str:
    """`text` with every per-process graph uuid and continuation counter replaced by a placeholder."""
    text = _COMPILED_FN.sub("__compiled_fn_<n>_<uuid>", text)
    return _RESUME_AT.sub(r"\1_<n>", text)
