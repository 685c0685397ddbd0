"""Time to the first step on every rank, side by side in one run: torch.compile vs precompile.

On 2 and 4 gloo ranks (CPU, 127.0.0.1), each rank a fresh process running one step of a model that
ends in a functional all_reduce, one table per model (`--model`): `mlp`, a 4-layer 256-wide MLP, and
`transformer`, precompile's own demo transformer (the one `precompile demo` captures, built by
precompile.examples.transformer.make_demo). Every mode of a model runs the same step:

  compile-cold   torch.compile on every rank, an empty Inductor cache dir shared by the ranks
  compile-warm   torch.compile on every rank, the cache dir compile-cold filled
  precompile     precompile.distributed.load_everywhere of a pair captured beforehand (MakeFxTracer,
                 backend="inductor", in a world of the same size; the capture is not timed), first
                 step under no_compilation()

`first step` is from the moment the parent starts the ranks to the first step finished on the last
rank; `after import` leaves out each rank's interpreter start and `import torch` (the slowest rank's).
A second table splits the last rank's first step time into phases: start python (spawn, interpreter,
this script's stdlib imports), import torch, join group (import torch.distributed,
init_process_group), build model, load (import precompile and load_everywhere, or torch.compile,
which imports Dynamo and Inductor), first step (the compile, where there is one). precompile's floor
is the first four: what every mode spends before precompile's own work begins.

Every mode's ranks start the same way: a plain `python bench/ranks.py --rank ...` each (torchrun would
add its launcher's own `import torch` to every row alike), with OMP_NUM_THREADS=1 as torchrun sets it,
and importing only what the mode uses. precompile's modules are byte-compiled first, as installing
a wheel does (torch's come compiled): a checkout run from a shell that sets PYTHONDONTWRITEBYTECODE
would otherwise compile precompile's sources anew in every precompile rank, and no other mode's.
`compile CPU-s` is, summed over ranks, the CPU seconds (the process and its compiler children) the
first step took beyond a second, identical step: what compiling cost. precompile's first step runs
under no_compilation(), which raises rather than compile, so its figure is first-call noise.

    python bench/ranks.py [--worlds 2,4] [--model mlp,transformer] [--repeat 1]

What it showed (--repeat 3, 2 CPUs shared with other jobs, load average 3 to 5): the issue's target,
precompile <= 0.2x compile-warm, is not met for either model at 2 or 4 ranks. precompile took
0.30x and 0.33x warm (mlp, 2 and 4 ranks) and 0.33x and 0.30x (transformer), and its floor alone
was 0.29x to 0.32x warm: starting python and `import torch` on every rank (2.6 to 6.8 s here) are
most of it. precompile's own load and first step took 0.12 to 0.32 s (about 0.01x warm), and
0.01 to 0.03 compile CPU-seconds against 10 to 22 for compile-warm and 24 to 54 for compile-cold.
The target needs a step whose warm torch.compile costs at least five times the floor.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.coldstart import byte_compile_precompile

MODES = ("compile-cold", "compile-warm", "precompile")
# Each rank's timestamps, in order; the phase ending at each is named in PHASE_TITLES.
PHASES = ("python", "torch", "joined", "built", "ready", "first_done")
PHASE_TITLES = ("start python", "import torch", "join group", "build model", "load", "first step")
FLOOR_PHASES = 4  # the phases every mode spends alike, before precompile's own load
MODELS = {
    "mlp": "a 4-layer 256-wide MLP (GELU), batch 32",
    "transformer": "precompile's demo TinyTransformer (precompile.examples.transformer.make_demo: 2 blocks, width 64, "
                   "4 heads, input 2x16x64)",
}
TIMEOUT_S = 900


def build(model_name: str):
    import torch

    if model_name == "transformer":
        from precompile.examples.transformer import make_demo

        return make_demo()
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(layer for _ in range(4) for layer in (torch.nn.Linear(256, 256), torch.nn.GELU())))
    return model, torch.randn(32, 256)


def step(model, x):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    return funcol.all_reduce(model(x).softmax(-1), "sum", dist.group.WORLD)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _rank_main(rank: int, world: int, port: str, mode: str, pair: str, model_name: str) -> None:
    marks = {"python": time.time()}  # the interpreter is up and this script's stdlib imports are done
    import torch

    marks["torch"] = time.time()
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    marks["joined"] = time.time()
    model, x = build(model_name)
    marks["built"] = time.time()
    artifact, cache = f"{pair}.py", f"{pair}.cache"
    with torch.no_grad():
        if mode == "capture":
            import precompile

            with precompile.capture(step, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer()) as cap:
                cap(model, x)
            print(json.dumps({"rank": rank}))
            dist.destroy_process_group()
            return
        if mode == "precompile":
            import precompile

            served = precompile.distributed.load_everywhere(artifact, cache)
            marks["ready"] = time.time()
            cpu = _cpu_seconds()  # loading reads, checks and execs the pair: it compiles nothing
            with precompile.no_compilation():
                served(model, x)
                marks["first_done"] = time.time()
                first_cpu = _cpu_seconds() - cpu
                served(model, x)
        else:
            cpu = _cpu_seconds()
            compiled = torch.compile(step)
            marks["ready"] = time.time()
            compiled(model, x)
            marks["first_done"] = time.time()
            first_cpu = _cpu_seconds() - cpu
            compiled(model, x)
        second_cpu = _cpu_seconds() - cpu - first_cpu
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "marks": marks, "compile_cpu": max(0.0, first_cpu - second_cpu)}))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _run_world(world: int, mode: str, pair: Path, cache_dir: Path, model_name: str) -> dict:
    env = {"OMP_NUM_THREADS": "1", **os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(ROOT)}
    port = str(_free_port())
    started = time.time()
    procs = [
        subprocess.Popen([sys.executable, __file__, "--rank", str(rank), str(world), port, mode, str(pair), model_name],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(world)
    ]
    try:
        outputs = [proc.communicate(timeout=TIMEOUT_S) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
            proc.communicate()
        raise SystemExit(f"{mode} of the {model_name} on {world} ranks did not finish within {TIMEOUT_S} s")
    for rank, (proc, (out, err)) in enumerate(zip(procs, outputs)):
        if proc.returncode != 0:
            raise SystemExit(f"{mode} of the {model_name}: rank {rank} of {world} failed:\n{err[-3000:]}")
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
    if mode == "capture":
        return {}
    last = max(results, key=lambda r: r["marks"]["first_done"])["marks"]
    edges = [started, *(last[name] for name in PHASES)]
    return {
        "first_step_s": last["first_done"] - started,
        "after_import_s": max(r["marks"]["first_done"] - r["marks"]["torch"] for r in results),
        "compile_cpu_s": sum(r["compile_cpu"] for r in results),
        "phases_s": [end - begin for begin, end in zip(edges, edges[1:])],
    }


def _bench_world(world: int, model_name: str, repeat: int) -> None:
    """Capture, then time every mode on `world` ranks; print its rows."""
    work = Path(tempfile.mkdtemp(prefix=f"precompile-bench-ranks-{model_name}-{world}-"))
    try:
        pair = work / "step"
        _run_world(world, "capture", pair, work / "capture-cache", model_name)
        rows = {"compile-cold": _run_world(world, "compile-cold", pair, work / "compile-cache", model_name)}
        runs: dict[str, list[dict]] = {"compile-warm": [], "precompile": []}
        for _ in range(repeat):  # round robin, so a change in the host's load hits every mode alike
            for mode, mode_runs in runs.items():
                cache_dir = work / ("compile-cache" if mode == "compile-warm" else "serve-cache")
                mode_runs.append(_run_world(world, mode, pair, cache_dir, model_name))
        rows.update((mode, min(mode_runs, key=lambda r: r["first_step_s"])) for mode, mode_runs in runs.items())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    warm = rows["compile-warm"]
    for mode in MODES:
        row = rows[mode]
        print(f"{world:>5}  {mode:<13} {row['first_step_s']:>12.2f} {row['first_step_s'] / warm['first_step_s']:>6.2f}x "
              f"{row['after_import_s']:>15.2f} {row['after_import_s'] / warm['after_import_s']:>6.2f}x "
              f"{row['compile_cpu_s']:>14.2f}", flush=True)
    print(f"{'':>5}  where the last rank's first step time went, s: " + ", ".join(PHASE_TITLES))
    for mode in MODES:
        print(f"{world:>5}  {mode:<13} " + " ".join(f"{s:>12.2f}" for s in rows[mode]["phases_s"]), flush=True)
    floor = sum(rows["precompile"]["phases_s"][:FLOOR_PHASES])
    print(f"{world:>5}  precompile's floor ({', '.join(PHASE_TITLES[:FLOOR_PHASES])}): {floor:.2f} s = "
          f"{floor / warm['first_step_s']:.2f}x warm; its own load and first step: "
          f"{sum(rows['precompile']['phases_s'][FLOOR_PHASES:]):.2f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--model", default=",".join(MODELS), help=f"comma-separated, each its own table: {', '.join(MODELS)}")
    parser.add_argument("--repeat", type=int, default=1, help="runs of compile-warm and precompile (best kept)")
    options = parser.parse_args()
    model_names = options.model.split(",")
    unknown = sorted(set(model_names) - set(MODELS))
    if unknown:
        parser.error(f"--model: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    byte_compile_precompile()
    for model_name in model_names:
        print(f"\nmodel: {model_name}, {MODELS[model_name]}; host: {os.cpu_count()} CPUs, load average "
              f"{os.getloadavg()[0]:.1f} (other work on the host slows every row alike)")
        print(f"{'ranks':>5}  {'mode':<13} {'first step s':>12} {'x warm':>7} {'after import s':>15} {'x warm':>7} "
              f"{'compile CPU-s':>14}")
        for world in (int(w) for w in options.worlds.split(",")):
            _bench_world(world, model_name, options.repeat)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        _rank_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7])
    else:
        main()
