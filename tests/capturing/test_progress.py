"""A capture says what it is doing while it does it: each phase logged when it starts and when it ends,
and shown on stderr when asked for (plain lines when piped, a live line with elapsed time on a terminal)."""
from __future__ import annotations

import logging
import os
import pty
import subprocess
import sys

import torch

import precompile
from conftest import ROOT, TESTS

CAPTURE = """
import torch, precompile
def step(model, x):
    return model(x).relu()
model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
with precompile.capture(step, artifact_path="m.py", cache_path="m.cache", tracer=precompile.MakeFxTracer(),
                        backend="eager"{verbose}) as cap:
    cap(model, x)
"""
PHASES = ("trace with make_fx", "render the ATen graph", "load the rendered python_code", "seal the cache", "write m.py and m.cache")


def _command(verbose: str) -> list[str]:
    return [sys.executable, "-c", CAPTURE.format(verbose=verbose)]


def _environment(env: dict | None = None) -> dict:
    environment = {key: value for key, value in os.environ.items() if key != "PRECOMPILE_VERBOSE"}
    return {**environment, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)]), **(env or {})}


def _run(tmp_path, verbose: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_command(verbose), cwd=tmp_path, env=_environment(env), timeout=300, capture_output=True, text=True)


def test_every_phase_is_logged_when_it_starts_and_when_it_ends(tmp_path, caplog):
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="precompile"), precompile.capture(
        lambda m, t: m(t), artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
        tracer=precompile.MakeFxTracer(), backend="eager",
    ) as cap:
        cap(model, x)
    messages = [r.getMessage() for r in caplog.records if r.getMessage().startswith("capture: ")]
    starts = [m[len("capture: "):-len(" ...")] for m in messages if m.endswith(" ...")]
    assert starts[:4] == list(PHASES[:4]) and starts[4].startswith("write ")
    for name in starts:
        assert messages.index(f"capture: {name} ...") < next(i for i, m in enumerate(messages) if m.startswith(f"capture: {name} done in "))


def test_verbose_shows_plain_lines_when_piped_and_nothing_otherwise(tmp_path):
    for quiet in (_run(tmp_path), _run(tmp_path, env={"PRECOMPILE_VERBOSE": "0"})):
        assert quiet.returncode == 0, quiet.stderr
        assert "precompile:" not in quiet.stderr
    for run in (_run(tmp_path, ", verbose=True"), _run(tmp_path, env={"PRECOMPILE_VERBOSE": "1"})):
        assert run.returncode == 0, run.stderr
        lines = [line for line in run.stderr.splitlines() if line.startswith("precompile: ")]
        for name in PHASES:
            assert f"precompile: {name} ..." in lines
            assert any(line.startswith(f"precompile: {name} done in ") and line.endswith(" s") for line in lines)


def _on_a_terminal(tmp_path, verbose: str) -> str:
    leader, follower = pty.openpty()
    process = subprocess.Popen(_command(verbose), cwd=tmp_path, env=_environment(), stdout=subprocess.DEVNULL,
                               stderr=follower)
    os.close(follower)
    shown = b""
    try:
        while chunk := _read(leader):  # read while it runs: a full terminal buffer would block the child
            shown += chunk
    finally:
        os.close(leader)
    assert process.wait(timeout=300) == 0
    return shown.decode("utf-8", "replace")


def test_on_a_terminal_a_capture_shows_a_live_line_with_the_elapsed_time_by_default(tmp_path):
    for verbose in ("", ", verbose=True"):
        text = _on_a_terminal(tmp_path, verbose)
        assert "precompile: trace with make_fx done in" in text and "0:00:" in text  # rich's elapsed-time column
    assert "precompile:" not in _on_a_terminal(tmp_path, ", verbose=False")


def test_a_compile_phase_counts_the_kernel_libraries_built_so_far(tmp_path):
    from precompile.capturing import progress

    (tmp_path / "ab").mkdir()
    counted = progress.libraries_in(tmp_path)
    assert counted() == 0
    (tmp_path / "ab" / "k.main.so").write_bytes(b"")
    (tmp_path / "ab" / "k.main.cpp").write_bytes(b"")
    assert counted() == 1


def _read(descriptor: int) -> bytes:
    try:
        return os.read(descriptor, 65536)
    except OSError:  # EIO: the child closed its end
        return b""


def test_doctor_says_what_it_is_probing_when_piped():
    proc = subprocess.run([sys.executable, "-m", "precompile", "doctor", "--no-compiler-probe"], capture_output=True,
                          text=True, timeout=300, env=_environment())
    assert proc.returncode == 0, proc.stderr
    for step in ("import torch", "see what a fresh process imports to load an artifact"):
        assert f"precompile: {step} ..." in proc.stderr and f"precompile: {step} done in " in proc.stderr
