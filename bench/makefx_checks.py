"""What checking a MakeFx trace's reads (SPECIALIZED) costs a served call, side by side.

For each zoo model: capture fn with MakeFxTracer (eager backend, so the graph's own time is what
eager's is), then serve two copies of its python_code in this process, one as written and one with
its SPECIALIZED literal removed (the driver then checks nothing besides the calling convention),
calling them in turn with eager's own call. Prints each model's number of checked values, the
median per-call time of eager and both served copies, the checked/bare ratio, and, since two
medians of a millisecond call move by tens of microseconds between runs, what the checks
themselves take on a call (the driver's fast-path comparison, timed alone, best of 20 rounds) as a
share of eager's call (target: at most 2%) and of the bare served call.

    python bench/makefx_checks.py [--models bert,gpt2] [--calls 200]
"""
from __future__ import annotations

import argparse
import ast
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from zoo_models import ZOO  # noqa: E402

import precompile  # noqa: E402


def _without_checks(source: str) -> str:
    """python_code with its SPECIALIZED literal removed."""
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", None) == "SPECIALIZED")
    lines = source.splitlines(keepends=True)
    return "".join(lines[: node.lineno - 1] + lines[node.end_lineno:])  # type: ignore[operator]


def _served(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", precompile.PrecompileWarning)  # no cache: python_code alone
        return precompile.load(path, path.with_suffix(".absent"))


def measure(name: str, calls: int, directory: Path) -> dict:
    zoo = ZOO[name]
    model, args = zoo.instantiate()
    artifact, cache = directory / f"{name}.py", directory / f"{name}.cache"
    with zoo.grad_mode(), precompile.capture(zoo.step, artifact_path=artifact, cache_path=cache,
                                             tracer=precompile.MakeFxTracer(), backend="eager") as cap:
        cap(model, *args)
    source = artifact.read_text(encoding="utf-8")
    checks = len(ast.literal_eval(next(n.value for n in ast.parse(source).body if isinstance(n, ast.Assign)
                                       and getattr(n.targets[0], "id", None) == "SPECIALIZED")))
    bare = directory / f"{name}_bare.py"
    bare.write_text(_without_checks(source), encoding="utf-8")
    served = {"checked": _served(artifact), "bare": _served(bare), "eager": zoo.step}
    times: dict[str, list[float]] = {key: [] for key in served}
    with zoo.grad_mode():
        for runnable in served.values():
            runnable(model, *args)  # the full check once; then the fast path
        for round_ in range(calls):
            for key, runnable in (served.items() if round_ % 2 else reversed(served.items())):
                started = time.perf_counter()
                runnable(model, *args)
                times[key].append(time.perf_counter() - started)
        checks_alone = served["checked"]._forward.specialized  # the driver's checks, as a call runs them
        assert checks_alone.unchanged()
        rounds = []
        for _ in range(20):  # the best round: what the checks cost when the host lets them run
            started = time.perf_counter()
            for _ in range(calls):
                checks_alone.unchanged()
            rounds.append((time.perf_counter() - started) / calls * 1e6)
        check_us = min(rounds)
    eager_ms, checked, bare_ms = (statistics.median(times[key]) * 1e3 for key in ("eager", "checked", "bare"))
    return {"model": name, "checks": checks, "eager_ms": eager_ms, "checked_ms": checked, "bare_ms": bare_ms,
            "ratio": checked / bare_ms, "check_us": check_us, "of_eager": check_us / (eager_ms * 1e3),
            "share": check_us / (bare_ms * 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert,distilbert,gpt2,llama,t5,whisper")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown models {unknown}; the zoo has {sorted(ZOO)}")
    torch.set_num_threads(1)
    print(f"{'model':<12} {'checks':>6} {'eager ms':>9} {'checked ms':>11} {'bare ms':>8} {'ratio':>6} {'checks us':>9}"
          f" {'of eager':>8} {'of bare':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            why = ZOO[name].available()
            if why:
                print(f"{name:<12} skipped: {why}")
                continue
            row = measure(name, args.calls, Path(tmp))
            print(f"{row['model']:<12} {row['checks']:>6} {row['eager_ms']:>9.3f} {row['checked_ms']:>11.3f} {row['bare_ms']:>8.3f}"
                  f" {row['ratio']:>6.3f} {row['check_us']:>9.1f} {row['of_eager']:>8.1%} {row['share']:>8.1%}")


if __name__ == "__main__":
    main()
