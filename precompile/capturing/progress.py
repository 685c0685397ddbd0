"""What a capture is doing while it does it.

Each phase (trace, lower, check, freeze kernels, render, write) is logged through the `precompile`
logger when it starts and when it ends, so a long lowering step is visible as it begins. When asked
for (`capture(..., verbose=True)` or PRECOMPILE_VERBOSE=1), phases are also shown on stderr: on a
terminal as a live line with a spinner and the elapsed time (rich), elsewhere (piped, CI logs) as
plain `precompile: ...` lines.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import TaskID

log = logging.getLogger("precompile")

VERBOSE_VAR = "PRECOMPILE_VERBOSE"


def verbose_from(verbose: bool | None) -> bool:
    """The capture's `verbose=`, or, when not given, PRECOMPILE_VERBOSE set to 1."""
    return verbose if verbose is not None else os.environ.get(VERBOSE_VAR, "") == "1"


class _PlainLines:
    """Phases as plain lines on stderr, for output that is not a terminal."""

    def start(self, name: str) -> None:
        print(f"precompile: {name} ...", file=sys.stderr, flush=True)

    def end(self, name: str, elapsed: float) -> None:
        print(f"precompile: {name} done in {elapsed:.2f} s", file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class _LiveLine:
    """Phases as a live line with a spinner and the elapsed time, each kept with its time once done."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self._progress = Progress(SpinnerColumn(), TextColumn("precompile: {task.description}"), TimeElapsedColumn(),
                                  console=Console(stderr=True))
        self._progress.start()
        self._tasks: dict[str, TaskID] = {}

    def start(self, name: str) -> None:
        self._tasks[name] = self._progress.add_task(name, total=1)

    def end(self, name: str, elapsed: float) -> None:
        self._progress.update(self._tasks.pop(name), completed=1, description=f"{name} done in {elapsed:.2f} s")

    def close(self) -> None:
        self._progress.stop()


_shown: list[_PlainLines | _LiveLine] = []


@contextlib.contextmanager
def shown(verbose: bool) -> Iterator[None]:
    """Show the phases run inside this block on stderr (nothing to do unless `verbose`)."""
    if not verbose or _shown:
        yield
        return
    display = _LiveLine() if sys.stderr.isatty() else _PlainLines()
    _shown.append(display)
    try:
        yield
    finally:
        _shown.pop()
        display.close()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """One phase of a capture: logged (and shown, inside `shown`) when it starts and when it ends."""
    log.info("capture: %s ...", name)
    for display in _shown:
        display.start(name)
    started = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        log.info("capture: %s done in %.2f s", name, elapsed)
        for display in _shown:
            display.end(name, elapsed)
