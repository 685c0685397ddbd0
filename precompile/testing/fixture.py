"""`precompile_snapshot`: capture, serve fresh against eager, then compare the readable snapshots."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from precompile.testing.serving import CapturedPair, capture_and_serve


class SnapshotCapture:
    """What the fixture returns: call it once or more per test; each call is a snapshot of its own
    (`<test>.py`, then `<test>.1.py`, ...)."""

    def __init__(self, request: pytest.FixtureRequest, directory: Path) -> None:
        self._request = request
        self._directory = directory
        self._assertions: dict[bool, tuple[Any, Any]] = {}
        self._calls = 0

    def __call__(self, fn, *args, tolerance: float | None = None, per_torch: bool = False,
                 factory: Callable[[], Any] | None = None, **capture_kwargs) -> CapturedPair:
        __tracebackhide__ = True
        if factory is not None and args:
            raise TypeError("precompile_snapshot takes the arguments or a factory that builds them, not both: "
                            f"got {len(args)} argument(s) and factory={getattr(factory, '__qualname__', factory)!r}")
        code_assertion, table_assertion = self._snapshots(per_torch)
        prefix = self._directory / f"capture-{self._calls}"
        self._calls += 1
        pair = capture_and_serve(fn, args, prefix, tolerance=tolerance, capture_kwargs=capture_kwargs, factory=factory)

        from precompile.testing.normalize import mismatch_message, readable

        new = readable(pair.python_code, pair.cache)
        code_ok = code_assertion == new.code  # syrupy records both (used, written on --snapshot-update)
        table_ok = table_assertion == new.table
        if code_ok and table_ok:
            return pair
        stored = (_recalled(code_assertion), _recalled(table_assertion))
        location = code_assertion.executions[code_assertion.num_executions - 1].snapshot_location
        shown = os.path.relpath(location, self._request.config.rootpath)
        raise AssertionError(mismatch_message(stored, new, names=(f"snapshot {shown}", "this run")))

    def _snapshots(self, per_torch: bool) -> tuple[Any, Any]:
        """syrupy assertions of the python_code and the guard table, one pair per layout for the whole test."""
        if per_torch not in self._assertions:
            if importlib.util.find_spec("syrupy") is None:
                raise RuntimeError("precompile_snapshot stores its snapshots with syrupy: pip install 'precompile[pytest]'")
            try:
                snapshot = self._request.getfixturevalue("snapshot")
            except pytest.FixtureLookupError:
                raise RuntimeError("precompile_snapshot needs syrupy's pytest plugin, which is turned off "
                                   "(-p no:syrupy?)") from None
            from precompile.testing import extensions

            code, table = ((extensions.PerTorchModelCode, extensions.PerTorchGuardTable) if per_torch
                           else (extensions.ModelCodeSnapshot, extensions.GuardTableSnapshot))
            self._assertions[per_torch] = (snapshot.use_extension(code), snapshot.use_extension(table))
        return self._assertions[per_torch]


def _recalled(assertion) -> str | None:
    """The stored snapshot the last comparison read (None: there is none)."""
    return assertion.executions[assertion.num_executions - 1].recalled_data
