"""Capture once, serve on every rank: 2 gloo ranks on 127.0.0.1, each a fresh process.

Every launch is bounded: a rank that hangs (a deadlock, a collective nobody joins) is killed and
the test fails. Collectives time out after 60 s inside the ranks.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import precompile
from conftest import ROOT, TESTS, run_fresh

WORLD = 2
WORKER = TESTS / "rank_worker.py"

# (tracer, backend, step): both tracers, both kinds of collective; one inductor case.
CASES = {
    "makefx-eager-funcol": ("makefx", "eager", "sum_outputs"),
    "makefx-eager-dist": ("makefx", "eager", "train_step"),
    "dynamo-eager-funcol": ("dynamo", "eager", "sum_outputs"),
    "dynamo-eager-dist": ("dynamo", "eager", "train_step"),
    "dynamo-inductor-funcol": ("dynamo", "inductor", "sum_outputs"),
}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(*args: str, world: int = WORLD, timeout: float = 600) -> list[dict]:
    """Run rank_worker.py on `world` ranks; each rank's JSON result, by rank. A hang fails the test."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    port = str(_free_port())
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), str(rank), str(world), port, *args], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(world)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=timeout))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.communicate()
        pytest.fail(f"ranks {args} did not finish within {timeout} s (a hang)")
    results = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{err[-4000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{entry}/stat").read_text() if entry.isdigit() else ""
        except OSError:
            continue
        if stat and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry))
    return children


def run_torchrun(script: Path, *args: str, timeout: float = 600) -> str:
    """`python -m torch.distributed.run --nproc-per-node 2 script args` on 127.0.0.1 in script's dir;
    its output. A hang fails the test after killing torchrun's process group and each rank's (torchrun
    starts every rank in a session of its own, which would outlive torchrun and keep the pipe open)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={WORLD}", "--master-addr=127.0.0.1",
               f"--master-port={_free_port()}", script.name, *args]
    proc = subprocess.Popen(command, cwd=script.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for group in (*_children(proc.pid), proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"torchrun {script.name} {' '.join(args)} did not finish within {timeout} s (a hang)")
    assert proc.returncode == 0, f"torchrun {script.name} {' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}"
    return out


def test_the_documented_torchrun_recipe_captures_and_serves_on_two_ranks(tmp_path):
    """docs/ranks.md's step.py, verbatim, under torchrun: capture on both ranks (rank 0 writes the pair),
    then serve it on both through load_everywhere under no_compilation(), equal to eager."""
    page = (ROOT / "docs" / "ranks.md").read_text()
    recipe = re.search(r"```python\n(# step\.py, run as: torchrun .*?)```", page, re.DOTALL)
    assert recipe, "docs/ranks.md lost its torchrun recipe (a ```python block starting '# step.py, run as: torchrun')"
    script = tmp_path / "step.py"
    script.write_text(recipe.group(1))
    run_torchrun(script, "capture")
    assert "WORLD = {'size': 2, 'backend': 'gloo'" in (tmp_path / "artifact.py").read_text()
    assert (tmp_path / "artifact.cache").is_file()
    served = run_torchrun(script, "serve")
    # the ranks share torchrun's stdout, so one rank's line may land before the other's newline
    assert sorted(re.findall(r"rank (\d): served == eager: (True|False)", served)) == [("0", "True"), ("1", "True")], served


@pytest.fixture(scope="session")
def captured(tmp_path_factory):
    """Each case captured once on 2 ranks (writer rank 1 for one of them): {case: (pair, results)}."""
    done = {}

    def get(case: str):
        if case not in done:
            tracer, backend, step = CASES[case]
            directory = tmp_path_factory.mktemp(case)
            pair = (str(directory / "m.py"), str(directory / "m.cache"))
            writer = "1" if case == "makefx-eager-dist" else "0"
            done[case] = (pair, writer, run_ranks("capture", tracer, backend, step, *pair, writer))
        return done[case]

    return get


@pytest.mark.parametrize("case", CASES)
def test_spmd_capture_runs_on_every_rank_and_the_writer_alone_writes(captured, case):
    pair, writer, results = captured(case)
    assert [r.get("error") for r in results] == [None] * WORLD
    assert all(r["equal"] for r in results), results  # the captured call's results equal eager on each rank
    assert [r["writes"] for r in results] == [int(rank == int(writer)) for rank in range(WORLD)]
    assert Path(pair[0]).is_file() and Path(pair[1]).is_file()


@pytest.mark.parametrize("case", CASES)
def test_load_everywhere_serves_every_rank_from_the_source_rank_files(captured, case, tmp_path):
    pair, _, _ = captured(case)
    results = run_ranks("serve", CASES[case][2], *pair, "0", str(tmp_path / "not-here"))
    assert all(r["equal"] for r in results), results  # under no_compilation(), equal to eager
    assert all(r["cache_used"] for r in results)


@pytest.mark.parametrize("case", ["makefx-eager-funcol", "makefx-eager-dist"])
def test_python_code_runs_as_plain_python_on_every_rank(captured, case):
    pair, _, _ = captured(case)
    results = run_ranks("exec", CASES[case][2], pair[0])
    assert all(r["equal"] for r in results), results


def test_load_everywhere_from_another_source_rank(captured, tmp_path):
    pair, _, _ = captured("makefx-eager-funcol")
    results = run_ranks("serve", "sum_outputs", *pair, "1", str(tmp_path / "not-here"))
    assert all(r["equal"] for r in results), results


@pytest.mark.parametrize("case", ["makefx-eager-dist", "dynamo-eager-funcol"])
def test_the_artifact_records_its_world_and_show_prints_it(captured, case):
    pair, _, _ = captured(case)
    python_code = Path(pair[0]).read_text()
    assert "WORLD = {'size': 2, 'backend': 'gloo', 'groups': ({'name': '0', 'ranks': (0, 1)},), 'collectives': ('all_reduce',)}" in python_code
    shown = subprocess.run([sys.executable, "-m", "precompile", "show", *pair], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "world: size 2, backend gloo, collectives all_reduce" in shown.stdout
    assert "process groups: '0' ranks [0, 1]" in shown.stdout


def test_load_refuses_another_world_naming_both(captured):
    pair, _, _ = captured("makefx-eager-funcol")
    [result] = run_ranks("load_alone", *pair, world=1)
    assert "world of size 2 on backend 'gloo'" in result["alone"]["error"]
    assert "no torch.distributed process group" in result["alone"]["error"]
    assert "captured in a world of size 2 on backend 'gloo'" in result["world"]["error"]
    assert "runs in a world of size 1 on backend 'gloo'" in result["world"]["error"]


def test_a_collective_makefx_cannot_trace_is_refused_on_every_rank_naming_the_op(tmp_path):
    pair = (str(tmp_path / "m.py"), str(tmp_path / "m.cache"))
    results = run_ranks("capture", "makefx", "eager", "broadcast_outputs", *pair, "0")
    for result in results:
        assert "c10d.broadcast_" in result["error"], result
        assert result["writes"] == 0
    assert not Path(pair[0]).exists()


def test_a_graph_without_collectives_records_no_world(tmp_path):
    import torch

    def step(model, x):
        return model(x)

    with precompile.capture(step, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
                            tracer=precompile.MakeFxTracer(), backend="eager") as cap:
        cap(torch.nn.Linear(2, 2), torch.randn(1, 2))
    assert "WORLD" not in (tmp_path / "m.py").read_text()


def test_outside_a_world_the_kernel_dir_and_its_lock_are_the_single_process_ones():
    from precompile.serve.ranks import kernel_dir_suffix

    assert kernel_dir_suffix() == ""


def test_a_rank_never_waits_for_a_kernel_dir_another_job_holds(tmp_path):
    from precompile.capturing.kernel_dir import KernelDir, lock_path

    directory = tmp_path / "kernels-rank0"
    with open(lock_path(directory), "w") as other_job:
        fcntl.flock(other_job, fcntl.LOCK_EX)
        got = KernelDir(directory, rank=True, keep=False, fill=lambda _: None)
        assert got.directory == tmp_path / f"kernels-rank0-pid{os.getpid()}" and got.directory.is_dir()
        got.close()
    got = KernelDir(directory, rank=True, keep=False, fill=lambda _: None)
    assert got.directory == directory and directory.is_dir()
    got.close()
    assert not directory.exists()


def test_writer_rank_must_be_a_rank(tmp_path):
    with pytest.raises(precompile.PrecompileError, match="writer_rank must be a rank"):
        precompile.capture(lambda x: x, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache", writer_rank=-1)


def test_load_everywhere_needs_a_process_group(tmp_path):
    proc = run_fresh(
        "import precompile\n"
        "try:\n    precompile.distributed.load_everywhere('m.py', 'm.cache')\n"
        "except precompile.PrecompileError as exc:\n    print(exc)\n",
        timeout=120,
    )
    assert "needs an initialized torch.distributed process group" in proc.stdout, proc.stderr


FIXTURE = ROOT / "fixtures" / "v1" / "all_reduce_world"


def test_show_prints_a_committed_artifact_world_without_torch():
    shown = run_fresh(
        "import sys\n"
        "sys.modules['torch'] = None  # inspect must not need torch\n"
        "from precompile.cli.main import main\n"
        f"main(['show', {str(FIXTURE)!r}])\n",
        timeout=120,
    )
    assert "world: size 1, backend gloo, collectives all_reduce" in shown.stdout, shown.stderr
    assert "process groups: '0' ranks [0]" in shown.stdout


def test_loading_a_world_artifact_without_a_process_group_is_refused_naming_its_world():
    with pytest.raises(precompile.PrecompileError, match=r"captured in a world of size 1 on backend 'gloo'.*no torch.distributed process group"):
        precompile.load(f"{FIXTURE}.py", f"{FIXTURE}.cache")
