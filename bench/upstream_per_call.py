"""Per call, precompile's MakeFx+inductor artifact against torch 2.15's torch.compiler.precompile, interleaved.

bench/upstream.py times each side's steady-state call in its own process, so on a shared host the two
medians come from different moments. This captures both artifacts of bench/depth.py's decoder (same
weights, same input), then loads both in one fresh process and times their calls in turn with eager's
(round-robin, one thread, under no_grad): the medians are taken over the same stretch of host load.

    python bench/upstream_per_call.py [--layers 1] [--calls 100] [--work DIR]   (torch 2.15+)
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CAPTURE = r"""
import sys, torch
sys.path.insert(0, sys.argv[3])
torch.set_num_threads(1)
import precompile
import torch.compiler.precompile as upstream
from bench.depth import build
from precompile.examples.transformer import run
layers, work = int(sys.argv[1]), sys.argv[2]
model, x = build(layers)
with torch.no_grad():
    with precompile.capture(run, artifact_path=f"{work}/ours.py", cache_path=f"{work}/ours.cache",
                            tracer=precompile.MakeFxTracer(), backend="inductor") as cap:
        cap(model, x)
    with upstream.capture(run, artifact_path=f"{work}/upstream.py", cache_path=f"{work}/upstream.cache", backend="inductor") as cap:
        cap(model, x)
"""

SERVE = r"""
import statistics, sys, time, torch
sys.path.insert(0, sys.argv[3])
torch.set_num_threads(1)
import precompile, precompile.serve.load
import torch.compiler.precompile as upstream
from bench.depth import build
layers, work, calls = int(sys.argv[1]), sys.argv[2], int(sys.argv[4])
model, x = build(layers)
sides = {"precompile": precompile.load(f"{work}/ours.py", f"{work}/ours.cache"),
         "upstream": upstream.load(f"{work}/upstream.py", f"{work}/upstream.cache"),
         "eager": lambda m, t: m(t)}
times = {name: [] for name in sides}
with torch.no_grad():
    for served in sides.values():
        served(model, x), served(model, x)
    for _ in range(calls):
        for name, served in sides.items():
            started = time.perf_counter()
            served(model, x)
            times[name].append(time.perf_counter() - started)
medians = {name: statistics.median(samples) * 1e3 for name, samples in times.items()}
print(f"layers {layers}, {calls} interleaved calls each, median ms: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items()))
print(f"upstream / precompile per call: {medians['upstream'] / medians['precompile']:.2f}x; "
      f"precompile / eager: {medians['precompile'] / medians['eager']:.2f}x")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--work", type=Path, default=None, help="where the pairs go (default: a temporary dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for code, extra in ((CAPTURE, []), (SERVE, [str(args.calls)])):
            subprocess.run([sys.executable, "-c", code, str(args.layers), str(work), str(ROOT), *extra], check=True)


if __name__ == "__main__":
    main()
