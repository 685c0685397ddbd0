"""One rank of a multi-rank test: `python rank_worker.py RANK WORLD PORT SCENARIO ARGS...`.

Joins a gloo world over 127.0.0.1 (60 s collective timeout) and prints one JSON line of results.
"""
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import precompile
import rank_cases
from precompile.capturing import api as capture_module


def _equal(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return len(a) == len(b) and all(torch.allclose(torch.as_tensor(x).detach(), torch.as_tensor(y).detach()) for x, y in zip(a, b))


def _eager(fn, rank):
    model, x = rank_cases.model_and_input(rank)
    return fn(model, x)


def _grad_mode(fn_name):
    """sum_outputs is an inference step: it runs (captured, served, eager) without autograd."""
    return torch.no_grad() if fn_name == "sum_outputs" else torch.enable_grad()


def do_capture(rank, tracer, backend, fn_name, artifact, cache, writer_rank):
    fn = getattr(rank_cases, fn_name)
    expected = _eager(fn, rank)
    writes = []
    original = capture_module.write_pair
    capture_module.write_pair = lambda *args: (writes.append(rank), original(*args))
    model, x = rank_cases.model_and_input(rank)
    chosen = precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer()
    try:
        with precompile.capture(fn, artifact_path=artifact, cache_path=cache, tracer=chosen, backend=backend,
                                writer_rank=int(writer_rank)) as cap:
            got = cap(model, x)
    except precompile.PrecompileError as exc:
        return {"error": str(exc), "writes": len(writes)}
    return {"equal": _equal(got, expected), "writes": len(writes)}


def do_serve(rank, fn_name, artifact, cache, src, elsewhere):
    src = int(src)
    if rank != src:  # the pair exists only on the source rank: the others name a dir that is not there
        artifact, cache = f"{elsewhere}/{artifact.rsplit('/', 1)[-1]}", f"{elsewhere}/{cache.rsplit('/', 1)[-1]}"
    fn = getattr(rank_cases, fn_name)
    expected = _eager(fn, rank)
    served = precompile.distributed.load_everywhere(artifact, cache, src=src)
    model, x = rank_cases.model_and_input(rank)
    with precompile.no_compilation():
        got = served(model, x)
    return {"equal": _equal(got, expected), "cache_used": served.cache_used}


def do_exec(rank, fn_name, artifact):
    """python_code run as plain Python, as its banner says: only torch and the process group."""
    namespace = {"__file__": artifact}
    exec(compile(open(artifact).read(), artifact, "exec"), namespace)  # noqa: S102
    model, x = rank_cases.model_and_input(rank)
    return {"equal": _equal(namespace["forward"](model, x), _eager(getattr(rank_cases, fn_name), rank))}


def do_load(rank, artifact, cache):
    try:
        precompile.load(artifact, cache)
    except precompile.PrecompileError as exc:
        return {"error": str(exc)}
    return {"loaded": True}


def main():
    rank, world, port, scenario, *args = sys.argv[1:]
    rank, world = int(rank), int(world)
    results = {}
    if scenario == "load_alone":  # no process group first, then a world of this size
        results["alone"] = do_load(rank, *args)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        if scenario == "capture":
            with _grad_mode(args[2]):
                results.update(do_capture(rank, *args))
        elif scenario == "serve":
            with _grad_mode(args[0]):
                results.update(do_serve(rank, *args))
        elif scenario == "exec":
            with _grad_mode(args[0]):
                results.update(do_exec(rank, *args))
        elif scenario == "load_alone":
            results["world"] = do_load(rank, *args)
    finally:
        dist.destroy_process_group()
    print(json.dumps({"rank": rank, **results}))


if __name__ == "__main__":
    main()
    # The verdict is printed: skip the interpreter's teardown. After torch's funcol wrapper ran (the
    # eager reference), torch 2.13 can leave gloo threads that abort the process at exit ("terminate
    # called without an active exception"), a flake of torch's teardown, not of what these tests check.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
