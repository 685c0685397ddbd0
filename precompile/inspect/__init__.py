"""precompile.inspect: a torch-free forensic reader, verifier and semantic diff of artifact pairs.

Nothing here executes, imports or unpickles anything from an artifact, and nothing here imports
torch: python_code is read with `ast`, the cache header-first with a typed msgspec decode, pickles
with a static `pickletools` scan.

The stable Python API is what this module exports (`__all__`, documented in docs/api.md): open an
artifact (`open_path`, `open_artifact`), then ask what each CLI verb answers, typed as its `--json`
report: `show_report`, `guards_report`, `diff_report`, `verify_report`; `scan_pickle` scans any
pickle's bytes; `mask_process_ids` and `mask_artifact_names` normalize text as `diff` compares it.
Other modules here are internal and may change.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precompile.artifact.pickle_scan import scan_pickle
    from precompile.inspect.api import diff_report, guards_report, open_path, show_report, verify_report
    from precompile.inspect.diff.diff import CATEGORIES
    from precompile.inspect.diff.process_ids import mask_artifact_names, mask_process_ids
    from precompile.inspect.model.artifact import (
        Artifact,
        FrameGuards,
        Guards,
        GuardSlot,
        PickleImport,
        PickleScan,
        Specialization,
    )
    from precompile.inspect.model.report import (
        Check,
        CodeDiff,
        DiffEntry,
        DiffReport,
        GuardsReport,
        KernelDiff,
        ShowReport,
        VerifyReport,
    )
    from precompile.inspect.reading.reader import open_artifact, resolve_pair

__all__ = [
    "CATEGORIES", "Artifact", "Check", "CodeDiff", "DiffEntry", "DiffReport", "FrameGuards", "GuardSlot", "Guards",
    "GuardsReport", "KernelDiff", "PickleImport", "PickleScan", "ShowReport", "Specialization", "VerifyReport",
    "diff_report", "guards_report", "mask_artifact_names", "mask_process_ids", "open_artifact", "open_path",
    "resolve_pair", "scan_pickle", "show_report", "verify_report",
]

# Imported on first use, so the CLI's start (which imports this package for every verb) stays as quick as
# before the API was exported, and the bytecode proof's child imports only what it runs: name -> the module
# that defines it.
_LAZY = {
    **dict.fromkeys(("Artifact", "FrameGuards", "Guards", "GuardSlot", "PickleImport", "PickleScan", "Specialization"),
                    "precompile.inspect.model.artifact"),
    **dict.fromkeys(("open_artifact", "resolve_pair"), "precompile.inspect.reading.reader"),
    **dict.fromkeys(("diff_report", "guards_report", "open_path", "show_report", "verify_report"), "precompile.inspect.api"),
    "CATEGORIES": "precompile.inspect.diff.diff",
    "scan_pickle": "precompile.artifact.pickle_scan",
    "mask_artifact_names": "precompile.inspect.diff.process_ids",
    "mask_process_ids": "precompile.inspect.diff.process_ids",
    **dict.fromkeys(("Check", "CodeDiff", "DiffEntry", "DiffReport", "GuardsReport", "KernelDiff", "ShowReport", "VerifyReport"),
                    "precompile.inspect.model.report"),
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
