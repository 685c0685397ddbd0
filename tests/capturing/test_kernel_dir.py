"""Captures of one user on one host take turns in the kernel dir: held only while they compile into it
or read it, a wait said after a second naming the holder, and bounded (kernel_dir.py)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

import precompile
from conftest import ROOT, TESTS
from precompile.capturing import kernel_dir
from precompile.capturing.kernels import CAPTURE_DIR_NAME


def _lock(directory) -> str:
    return str(kernel_dir.lock_path(directory / f"{CAPTURE_DIR_NAME}-{os.getuid()}"))


def test_a_wait_is_said_after_a_second_naming_the_holder_and_ends_when_it_lets_go(tmp_path, caplog):
    path = tmp_path / "kernels.lock"
    held = kernel_dir.try_take(path)
    assert held is not None
    threading.Timer(1.6, os.close, [held]).start()
    started = time.monotonic()
    with caplog.at_level(logging.INFO, logger="precompile"):
        taken = kernel_dir.take(path, timeout=60)
    os.close(taken)
    assert 1.5 < time.monotonic() - started < 30
    said = [r.getMessage() for r in caplog.records]
    assert f"capture: wait for the capture kernel dir lock {path}, held by pid {os.getpid()} (" in said[0], said
    assert said[1].startswith(f"capture: wait for the capture kernel dir lock {path}") and float(said[1].split(" done in ")[1][:-2]) > 1.5


def test_a_capture_gives_up_on_a_held_lock_naming_it_its_holder_and_the_remedy(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(kernel_dir.TIMEOUT_VAR, "0.3")
    held = kernel_dir.try_take(kernel_dir.lock_path(tmp_path / f"{CAPTURE_DIR_NAME}-{os.getuid()}"))
    try:
        with pytest.raises(precompile.PrecompileError) as raised, precompile.capture(
            lambda x: x.cos(), artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
            tracer=precompile.MakeFxTracer(), backend="inductor",
        ) as cap:
            cap(torch.ones(2))
    finally:
        os.close(held)
    message = str(raised.value)
    assert f"gave up after 0.3 s waiting for the capture kernel dir lock {_lock(tmp_path)}, held by pid {os.getpid()} (" in message
    assert f"set {kernel_dir.TIMEOUT_VAR} to wait longer than 0.3 s" in message
    assert not (tmp_path / "m.py").exists() and not (tmp_path / "m.cache").exists()


@pytest.mark.parametrize("given", ["soon", "0", "-5", "inf", "nan"])
def test_a_timeout_that_is_not_seconds_over_zero_is_refused_naming_it(monkeypatch, given):
    monkeypatch.setenv(kernel_dir.TIMEOUT_VAR, given)
    with pytest.raises(precompile.PrecompileError, match=f"{kernel_dir.TIMEOUT_VAR} is '{given}', not a number of seconds"):
        kernel_dir.lock_timeout()


# The first capture: DynamoTracer, holding nothing before its first call or between its calls; its
# build pauses while it holds the dir, until the test has seen the second capture say it waits.
FIRST = r"""
import os, sys, time, torch, precompile, dynamo_cases as dc
from pathlib import Path
from precompile.capturing import kernel_dir, pipeline
signals, lock = Path(sys.argv[1]), Path(sys.argv[2])

def free():
    descriptor = kernel_dir.try_take(lock)
    assert descriptor is not None, kernel_dir.holder(lock)
    os.close(descriptor)

freeze = pipeline.freeze
def paused(*args):
    (signals / "first-holds").touch()
    deadline = time.monotonic() + 240
    while not (signals / "second-waits").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return freeze(*args)
pipeline.freeze = paused

model = torch.nn.Linear(4, 4)
with torch.no_grad(), precompile.capture(dc.break_and_scale, artifact_path=signals / "first.py",
                                         cache_path=signals / "first.cache") as cap:
    free()  # the caller's code before the first call
    cap(model, torch.ones(2, 4))
    free()  # and between calls
    cap(model, torch.ones(2, 4))
"""
SECOND = r"""
import sys, torch, precompile
with torch.no_grad(), precompile.capture(lambda x: x.cos() * 2, artifact_path=sys.argv[1] + "/second.py",
                                         cache_path=sys.argv[1] + "/second.cache", tracer=precompile.MakeFxTracer()) as cap:
    cap(torch.ones(3))
"""


def test_two_captures_in_two_processes_take_turns_the_second_saying_it_waits_and_for_whom(tmp_path):
    environment = {**os.environ, "TMPDIR": str(tmp_path), "PRECOMPILE_VERBOSE": "1",
                   "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    log = (tmp_path / "second.err").open("w")
    first = subprocess.Popen([sys.executable, "-c", FIRST, str(tmp_path), _lock(tmp_path)], env=environment,
                             stderr=subprocess.PIPE, text=True)
    second = None
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "first-holds").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
            time.sleep(0.2)
        second = subprocess.Popen([sys.executable, "-c", SECOND, str(tmp_path)], env=environment, stderr=log)
        while "precompile: wait for the capture kernel dir lock" not in (tmp_path / "second.err").read_text():
            assert second.poll() is None and time.monotonic() < deadline, (tmp_path / "second.err").read_text()
            time.sleep(0.2)
        (tmp_path / "second-waits").touch()
        _, first_err = first.communicate(timeout=300)
        assert first.returncode == 0, first_err
        assert second.wait(timeout=300) == 0, (tmp_path / "second.err").read_text()
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
        log.close()
    said = (tmp_path / "second.err").read_text()
    assert f"precompile: wait for the capture kernel dir lock {_lock(tmp_path)}, held by pid {first.pid} (" in said, said
    assert "precompile: lower with Inductor ..." in said and said.index("wait for") < said.index("lower with Inductor")
    for name in ("first", "second"):
        assert (tmp_path / f"{name}.py").is_file() and (tmp_path / f"{name}.cache").is_file()
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(CAPTURE_DIR_NAME) and path.is_dir()]
