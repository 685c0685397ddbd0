"""What a capture is doing while it does it.

Each phase (trace, lower, check, freeze kernels, render, write) is logged through the `precompile`
logger when it starts and when it ends, so a long lowering step is visible as it begins. Phases are
also shown on stderr by default when stderr is a terminal, as a live line with a spinner, the
elapsed time and, while Inductor compiles, how many kernel libraries it has built so far (rich);
`capture(..., verbose=False)` or PRECOMPILE_VERBOSE=0 keeps a terminal quiet. Output that is not a
terminal (piped, CI logs) stays quiet unless asked for (`verbose=True`, PRECOMPILE_VERBOSE=1), and
then gets plain `precompile: ...` lines.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import TaskID

log = logging.getLogger("precompile")


def libraries_in(directory) -> Callable[[], int]:
    """A count of the kernel libraries (.so) under `directory` so far: what a compile phase has built."""
    return lambda: sum(1 for _ in directory.rglob("*.so"))

VERBOSE_VAR = "PRECOMPILE_VERBOSE"


def verbose_from(verbose: bool | None) -> bool:
    """The capture's `verbose=`; when not given, PRECOMPILE_VERBOSE (1 or 0) where set, else whether
    stderr is a terminal."""
    if verbose is not None:
        return verbose
    setting = os.environ.get(VERBOSE_VAR, "")
    if setting in ("0", "1"):
        return setting == "1"
    return sys.stderr.isatty()


class _PlainLines:
    """Phases as plain lines on stderr, for output that is not a terminal."""

    def start(self, name: str, counted: Callable[[], int] | None = None) -> None:
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
        self._counters: dict[str, threading.Event] = {}

    def start(self, name: str, counted: Callable[[], int] | None = None) -> None:
        task = self._tasks[name] = self._progress.add_task(name, total=1)
        if counted is not None:  # a long compile: how many kernels so far, every half second
            done = threading.Event()
            self._counters[name] = done
            threading.Thread(target=self._count, args=(task, name, counted, done), daemon=True).start()

    def _count(self, task: TaskID, name: str, counted: Callable[[], int], done: threading.Event) -> None:
        while not done.wait(0.5):
            with contextlib.suppress(OSError):  # the directory counted may be moving under us
                self._progress.update(task, description=f"{name} ({counted()} kernel libraries built)")

    def end(self, name: str, elapsed: float) -> None:
        counter = self._counters.pop(name, None)
        if counter is not None:
            counter.set()
        self._progress.update(self._tasks.pop(name), completed=1, description=f"{name} done in {elapsed:.2f} s")

    def close(self) -> None:
        for counter in self._counters.values():
            counter.set()
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
def phase(name: str, counted: Callable[[], int] | None = None, *, since: float | None = None) -> Iterator[None]:
    """One phase of a capture: logged (and shown, inside `shown`) when it starts and when it ends;
    `counted`: how many kernel libraries the phase has built so far, shown live on a terminal;
    `since`: when it began (time.perf_counter), where it is said only once it has gone on a while."""
    log.info("capture: %s ...", name)
    for display in _shown:
        display.start(name, counted)
    started = time.perf_counter() if since is None else since
    try:
        yield
    finally:
        elapsed = time.perf_counter() - started
        log.info("capture: %s done in %.2f s", name, elapsed)
        for display in _shown:
            display.end(name, elapsed)
