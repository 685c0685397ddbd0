"""The differential suite: state changed after capture, property-based (hypothesis).

Each example is a generated program (tests/differential_programs.py) whose forward reads Python
state of every kind a trace can specialize on; it is captured with both tracers (eager backend,
in this process), then a serving process that never captured anything makes each generated change
(an attribute, a config field, a config container's item, field or slot, a global, a global tensor
in place, a dict or list in place, a buffer, BatchNorm's training flag, a closure cell, a lambda or
closure attribute swapped, a torch function or a torch layer's forward patched, requires_grad
flipped, grad mode, the default dtype, or nothing) to a freshly built model on both sides and calls
fn eagerly and the loaded artifact. Every case must end in the served result equal to eager's
(values, dtype, shape, whether it carries autograd, the models' state after), a refusal (CallMismatch, or capture refused the program), or both
raising alike, never a silently different result. The one other outcome allowed: a MakeFx capture
that warned it cannot check a closure cell, whose served call keeps the captured value.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import differential_programs as programs
import property_budget as budget
import pytest
import torch
from conftest import ROOT, TESTS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import precompile

CHANGES_PER_PROGRAM = 12
TRACERS = {"makefx": precompile.MakeFxTracer, "dynamo": precompile.DynamoTracer}
REPLY_TIMEOUT = 300


class Worker:
    """The serving process, started once: one job a line in, one reply a line out, each waited for
    a bounded time."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import differential_worker; differential_worker.main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.replies: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def serve(self, job: dict) -> list[dict]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.replies.get(timeout=REPLY_TIMEOUT)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"the serving process gave no reply in {REPLY_TIMEOUT} s") from None
        if line is None:
            raise AssertionError(f"the serving process ended: {self.proc.stderr.read() if self.proc.stderr else ''}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def worker():
    served = Worker()
    yield served
    served.close()


@pytest.fixture(scope="module")
def program_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("programs")
    sys.path.insert(0, str(directory))
    yield directory
    sys.path.remove(str(directory))


_count = iter(range(10**6))


def _capture(directory: Path, module, spec: dict, tracer: str) -> tuple[list[str] | None, list[str]]:
    """(the pair's paths, or None where capture refused the program; the warnings capture gave)."""
    name = f"{module.__name__}_{tracer}"
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    fn = module.make_closure(spec["values"]["closure"]) if "closure" in spec["features"] else module.step
    model, x = module.build(), torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with torch.set_grad_enabled(spec["grad"]), precompile.capture(
                fn, artifact_path=artifact, cache_path=cache, tracer=TRACERS[tracer](), backend="eager"
            ) as cap:
                cap(model, x)
        except precompile.CaptureRefused:
            return None, []
    return [str(artifact), str(cache)], [str(w.message) for w in caught if issubclass(w.category, precompile.PrecompileWarning)]


def _check(directory: Path, worker: Worker, spec: dict, changes: list[dict]) -> dict[str, int]:
    import importlib

    name = f"diffprog_{next(_count)}"
    (directory / f"{name}.py").write_text(programs.source(spec), encoding="utf-8")
    module = importlib.import_module(name)
    pairs, warned = {}, {}
    for tracer in TRACERS:
        pair, warned[tracer] = _capture(directory, module, spec, tracer)
        if pair is not None:
            pairs[tracer] = pair
    tally = {"same": 0, "refused": 0, "both raised": 0, "capture refused": 0, "warned": 0}
    tally["capture refused"] = (len(TRACERS) - len(pairs)) * len(changes)
    if not pairs:
        return tally
    replies = worker.serve({"dir": str(directory), "module": name, "spec": spec, "changes": changes, "pairs": pairs})
    for reply in replies:
        change = changes[reply["change"]]
        if reply["outcome"] == "DIFFERENT" and change["what"] == "closure" and any("closure cell k" in w for w in warned[reply["tracer"]]):
            tally["warned"] += 1  # the documented outcome: capture said it cannot check the cell
            continue
        context = f"change {change}\nprogram {json.dumps(spec)}\n{programs.source(spec)}"
        assert reply["outcome"] in tally, (
            f"{reply['tracer']} served a silently different result, or failed: {reply['outcome']} {reply['detail']}\n{context}"
        )
        if programs.changes_nothing(change, spec):
            assert reply["outcome"] == "same", f"{reply['tracer']} refused a call that changed nothing: {reply['detail']}\n{context}"
        tally[reply["outcome"]] += 1
    return tally


def _run(program_dir, worker, spec, changes, totals):
    for outcome, count in _check(program_dir, worker, spec, changes).items():
        totals[outcome] = totals.get(outcome, 0) + count


def _suite(examples: int):
    """`examples` programs, each feature leading as many of them in turn (a search of its own for each
    lead: hypothesis' draws favour the first of a list, which left the last features all but undrawn)."""
    totals: dict[str, int] = {}
    leads = programs.FEATURES[:examples] if examples < len(programs.FEATURES) else programs.FEATURES
    per_lead = max(1, -(-examples // len(leads)))

    def searched(lead: str):
        @settings(max_examples=budget.examples(per_lead), deadline=None,
                  suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
        @given(data=st.data())
        def run(program_dir, worker, data):
            spec = data.draw(programs.programs(lead=lead), label="program")
            changes = data.draw(st.lists(programs.changes(spec), min_size=CHANGES_PER_PROGRAM, max_size=CHANGES_PER_PROGRAM),
                                label="changes")
            _run(program_dir, worker, spec, changes, totals)
        return run

    def run_all(program_dir, worker):
        for lead in leads:
            searched(lead)(program_dir, worker)

    return run_all, totals


@pytest.mark.hypothesis  # its @given is made per test, where hypothesis's plugin does not see it
def test_state_changed_after_capture_serves_eager_or_refuses_fast_slice(program_dir, worker):
    run, totals = _suite(3)
    run(program_dir, worker)
    assert sum(totals.values()) == 3 * CHANGES_PER_PROGRAM * len(TRACERS)


@pytest.mark.slow
@pytest.mark.hypothesis
def test_state_changed_after_capture_serves_eager_or_refuses(program_dir, worker):
    """50 programs x 12 changes: 600 cases per tracer, each served, refused or raising like eager."""
    run, totals = _suite(50)
    run(program_dir, worker)
    assert sum(totals.values()) >= 500 * len(TRACERS)
    assert totals["same"] > 100 and totals["refused"] > 100, totals  # both outcomes are exercised
    print("differential outcomes:", totals)
