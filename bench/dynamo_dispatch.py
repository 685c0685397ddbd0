"""Per-call cost of a served DynamoTracer artifact against torch.compile, side by side in one run.

The function has one graph break and several variants (two shapes and a float argument). A fresh
process captures it; another loads the artifact and compiles an identical function live, then
times both per call on every variant, interleaved so machine noise hits them alike.

    python bench/dynamo_dispatch.py [--backend inductor|eager]

With --backend eager neither side compiles kernels (torch.compile runs its FX graphs, the artifact its
rendered ATen functions), so the ratio is mostly what guard dispatch costs on each side.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CALLS = "[(model, torch.ones(4, 64), {}), (model, torch.ones(4, 64), {'scale': 3.0}), (model, torch.ones(16, 64), {})]"

CAPTURE = f"""
import sys, torch, precompile
sys.path.insert(0, sys.argv[2])
from bench import dispatch_compiled, dispatch_served
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
with torch.no_grad(), precompile.capture(dispatch_served.step, artifact_path=sys.argv[1] + "/d.py",
                                         cache_path=sys.argv[1] + "/d.cache", backend=sys.argv[3]) as cap:
    for m, x, kw in {CALLS}:
        cap(m, x, **kw)
"""

MEASURE = f"""
import json, statistics, sys, time, torch, precompile
sys.path.insert(0, sys.argv[2])
from bench import dispatch_compiled, dispatch_served
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
served = precompile.load(sys.argv[1] + "/d.py", sys.argv[1] + "/d.cache")
compiled = torch.compile(dispatch_compiled.step, backend=sys.argv[3])
calls = {CALLS}
results = {{}}
with torch.no_grad():
    for m, x, kw in calls:
        compiled(m, x, **kw); served(m, x, **kw)
    for index, (m, x, kw) in enumerate(calls):
        samples = {{"torch.compile": [], "precompile": []}}
        for _ in range(15):
            for name, fn in (("torch.compile", compiled), ("precompile", served)):
                t = time.perf_counter()
                for _ in range(200):
                    fn(m, x, **kw)
                samples[name].append((time.perf_counter() - t) / 200)
        results[f"variant {{index}}"] = {{k: statistics.median(v) for k, v in samples.items()}}
print(json.dumps(results))
"""


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("inductor", "eager"), default="inductor")
    backend = parser.parse_args().backend
    with tempfile.TemporaryDirectory(prefix="precompile-dispatch-") as work:
        subprocess.run([sys.executable, "-c", CAPTURE, work, str(ROOT), backend], check=True, capture_output=True)
        proc = subprocess.run([sys.executable, "-c", MEASURE, work, str(ROOT), backend], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"backend={backend}")
    print(f"{'call':<12}{'torch.compile us':>18}{'precompile us':>16}{'ratio':>8}")
    for name, row in results.items():
        ratio = row["precompile"] / row["torch.compile"]
        print(f"{name:<12}{row['torch.compile'] * 1e6:>18.1f}{row['precompile'] * 1e6:>16.1f}{ratio:>8.2f}")
    worst = max(row["precompile"] / row["torch.compile"] for row in results.values())
    print(f"-- target: served per call <= torch.compile's; worst ratio {worst:.2f} (<= 1)")


if __name__ == "__main__":
    main()
