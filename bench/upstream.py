"""precompile against torch's own `torch.compiler.precompile` (torch 2.15+), side by side in one run.

Both capture the same computation (`precompile.examples.transformer.run`, one forward of bench/depth.py's
decoder: width 256, 4 heads, MLP 1024, sequence 64, batch 2) with the MakeFx tracer, the only one upstream
has, and each backend (eager, inductor); each capture and each serve is a fresh process with its own empty
Inductor cache dir and TMPDIR, under `torch.no_grad()`, through bench/depth.py's child and helpers
(`measure`), so eager's baseline, our rows and upstream's are the same work around the part they differ in:

  eager               model(x), nothing captured
  makefx-<backend>    precompile.capture(..., tracer=MakeFxTracer(), backend=...) then precompile.load()
  upstream-<backend>  torch.compiler.precompile.capture(..., backend=...) then torch.compiler.precompile.load()

Columns, per layer count and backend (medians of `--repeat` interleaved rounds): `capture` the seconds
the `with capture(...)` block took in its own fresh process (one capture each); `import` importing the
loader (`precompile.serve.load` or `torch.compiler.precompile`, after `import torch`); `load` its
`load()`; `1st call` the first call after it; `first result` the whole process from its start to the
first result and its ratio to eager's; `per call` the steady-state median (ms); the python_code and
cache bytes. Then, per row pair, upstream's figure over ours (above 1: upstream takes longer or writes
more).

Run it with torch 2.15 (the first with `torch.compiler.precompile.capture`), one thread by default
(see bench/depth.py on threads and shared hosts):

    python bench/upstream.py [--layers 1,12] [--repeat 3] [--calls 10] [--threads 1] [--work DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.coldstart import byte_compile_precompile
from bench.depth import measure

BACKENDS = ("eager", "inductor")
SCENARIOS = ("eager", *(f"{who}-{backend}" for backend in BACKENDS for who in ("makefx", "upstream")))


def _seconds(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(theirs: float | None, ours: float | None) -> str:
    return f"{theirs / ours:.2f}x" if theirs and ours else "-"


def report(results: dict[int, dict]) -> list[str]:
    lines = [f"{'layers':>6}  {'capture with':<22}{'capture':>8}{'import':>8}{'load':>8}{'1st call':>9}{'first result':>13}"
             f"{'/eager':>7}{'per call':>9}  python_code / cache bytes"]
    ratios = ["", "upstream over ours (same layers and backend; above 1: upstream takes longer or writes more)",
              f"{'layers':>6}  {'backend':<9}{'capture':>9}{'load':>10}{'1st call':>10}{'first result':>13}{'per call':>10}"
              f"{'python_code':>12}{'cache':>8}"]
    for layers, measured in results.items():
        medians, sizes, captures = measured["medians"], measured["sizes"], measured["captures"]
        eager = medians.get("eager", {})
        if eager:
            lines.append(f"{layers:>6}  {'eager (no capture)':<22}{'':>41}{eager['total']:>13.2f}{'1.00':>7}"
                         f"{eager['per_call'] * 1e3:>9.1f}")
        for scenario in SCENARIOS[1:]:
            row, label = medians.get(scenario), scenario.replace("makefx-", "precompile ").replace("upstream-", "upstream ")
            if row is None:
                lines.append(f"{layers:>6}  {label:<22}{'failed':>8}")
                continue
            size = sizes.get(scenario, (0, 0))
            lines.append(
                f"{layers:>6}  {label:<22}{_seconds(captures.get(scenario), 2):>8}{row['import_precompile']:>8.3f}{row['load']:>8.3f}"
                f"{row['first_call']:>9.3f}{row['total']:>13.2f}{_ratio(row['total'], eager.get('total')).rstrip('x'):>7}"
                f"{row['per_call'] * 1e3:>9.1f}  {size[0]} / {size[1]}")
        for backend in BACKENDS:
            ours, theirs = medians.get(f"makefx-{backend}"), medians.get(f"upstream-{backend}")
            if ours is None or theirs is None:
                continue
            our_size, their_size = sizes.get(f"makefx-{backend}", (0, 0)), sizes.get(f"upstream-{backend}", (0, 0))
            ratios.append(
                f"{layers:>6}  {backend:<9}{_ratio(captures.get(f'upstream-{backend}'), captures.get(f'makefx-{backend}')):>9}"
                f"{_ratio(theirs['load'], ours['load']):>10}{_ratio(theirs['first_call'], ours['first_call']):>10}"
                f"{_ratio(theirs['total'], ours['total']):>13}{_ratio(theirs['per_call'], ours['per_call']):>10}"
                f"{_ratio(their_size[0], our_size[0]):>12}{_ratio(their_size[1], our_size[1]):>8}")
    return lines + ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="1,12")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds of fresh serving processes")
    parser.add_argument("--calls", type=int, default=10, help="timed steady-state calls per process, after 3 warm-up calls")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every child (0: torch's default)")
    parser.add_argument("--work", type=Path, help="keep (and reuse) the captured pairs here (a reused capture is not timed)")
    args = parser.parse_args()
    import torch

    if not hasattr(getattr(torch.compiler, "precompile", None), "capture"):
        parser.error(f"torch {torch.__version__} has no torch.compiler.precompile.capture: run this with torch 2.15 or later")
    byte_compile_precompile()
    results = {}
    for layers in (int(n) for n in args.layers.split(",")):
        results[layers], _ = measure(layers, SCENARIOS, args.repeat, args.calls, 0, False, args.threads,
                                     args.work.resolve() if args.work else None)
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads > 0 else "torch's default threads"
    print("\n".join([
        f"torch {torch.__version__}; host: {os.cpu_count()} CPUs, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}"
        f" at the end; {threads}; {args.repeat} round(s), per call median of {args.calls}; seconds unless marked", "",
        *report(results)]))


if __name__ == "__main__":
    main()
