"""Cold start against depth, side by side in one run: does load stay flat as the model gets deeper?

A decoder-only stack (`precompile.examples.transformer.TinyTransformer`: width 256, 4 heads, MLP
1024, sequence 64, batch 2) at each layer count, every scenario in a fresh process with its own empty
Inductor cache dir and TMPDIR (as in bench/coldstart.py):

  eager                     import torch, build the model, first call
  compile-warm              torch.compile with the local cache a previous process filled
  compile-mega              torch.compile primed by load_cache_artifacts() from save_cache_artifacts()
  aoti                      aoti_load_package() of a package aoti_compile_and_package() wrote
  makefx-eager, makefx-inductor, dynamo-eager, dynamo-inductor
                            precompile.load() of a pair captured with that tracer and backend + first call

Each row gives the whole process (start to first result, as the parent measured it), its ratio to
eager's, and for precompile: importing it (`precompile.serve.load`, after the model is built, so
it pays for the collection of torch's and the model's objects that its allocations set off), the
load part (`precompile.load()`) and the first call. Then, for the deepest layer count, the top entries of a cProfile of `precompile.load()`
per precompile scenario (a fresh process each).

    python bench/depth.py [--layers 1,4,16,48] [--scenarios ...] [--repeat 3] [--top 12]

Inductor captures and torch.compile preparations take minutes at 48 layers on a small machine:
pick layer counts and scenarios with the flags (e.g. `--layers 1,16 --scenarios
eager,makefx-eager,dynamo-eager,dynamo-inductor`).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.coldstart import _env  # noqa: E402

PRECOMPILE = ("makefx-eager", "makefx-inductor", "dynamo-eager", "dynamo-inductor")
SCENARIOS = ("eager", "compile-warm", "compile-mega", "aoti", *PRECOMPILE)

CHILD = r"""
import json, sys, time
started = time.perf_counter()
import torch
imported = time.perf_counter()
mode, layers, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.path.insert(0, sys.argv[4])
from bench.depth import build

model, x = build(layers)
out = {}

def finish(y):
    done = time.perf_counter()
    loaded = [n for n in ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd") if n in sys.modules]
    print(json.dumps({"after_import": done - imported, "import": imported - started, "loaded": loaded, **out}))

with torch.no_grad():
    if mode == "eager":
        finish(model(x))
    elif mode in ("compile-warm", "compile-prepare"):
        finish(torch.compile(model)(x))
    elif mode == "compile-mega-prepare":
        torch.compile(model)(x)
        open(f"{work}/mega.bin", "wb").write(torch.compiler.save_cache_artifacts()[0])
    elif mode == "compile-mega":
        torch.compiler.load_cache_artifacts(open(f"{work}/mega.bin", "rb").read())
        finish(torch.compile(model)(x))
    elif mode == "aoti-prepare":
        torch._inductor.aoti_compile_and_package(torch.export.export(model, (x,)), package_path=f"{work}/model.pt2")
    elif mode == "aoti":
        finish(torch._inductor.aoti_load_package(f"{work}/model.pt2")(x))
    elif mode.endswith("-prepare"):
        import precompile
        from precompile.examples.transformer import run
        tracer, backend = mode[: -len("-prepare")].split("-")
        with precompile.capture(run, artifact_path=f"{work}/{tracer}-{backend}.py", cache_path=f"{work}/{tracer}-{backend}.cache",
                                tracer=precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer(),
                                backend=backend) as cap:
            cap(model, x)
    elif mode.endswith("-profile"):
        import cProfile, io, pstats
        import precompile, precompile.serve.load
        name = mode[: -len("-profile")]
        profile = cProfile.Profile()
        profile.enable()
        served = precompile.load(f"{work}/{name}.py", f"{work}/{name}.cache")
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(int(sys.argv[5]))
        print(text.getvalue())
    else:
        t0 = time.perf_counter()
        import precompile
        import precompile.serve.load  # `import precompile` alone is lazy
        t1 = time.perf_counter()
        served = precompile.load(f"{work}/{mode}.py", f"{work}/{mode}.cache")
        t2 = time.perf_counter()
        y = served(model, x)
        out = {"import_precompile": t1 - t0, "load": t2 - t1, "first_call": time.perf_counter() - t2,
               "bytecode_from_cache": served.bytecode_from_cache, "metadata_from_cache": served.metadata_from_cache}
        finish(y)
"""


def build(layers: int):
    """The benchmark's model and input at `layers` layers, identical in every process."""
    import torch

    from precompile.examples.transformer import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(width=256, heads=4, hidden=1024, layers=layers).eval()
    return model, torch.randn(2, 64, 256, generator=torch.Generator().manual_seed(1))


def _run(mode: str, layers: int, work: Path, scratch: Path, *extra: str, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    cache_dir = cache_dir or Path(tempfile.mkdtemp(prefix="cache-", dir=scratch))
    tmp_dir = Path(tempfile.mkdtemp(prefix="tmp-", dir=scratch))
    return subprocess.run([sys.executable, "-c", CHILD, mode, str(layers), str(work), str(ROOT), *extra],
                          capture_output=True, text=True, env=_env(cache_dir, tmp_dir), timeout=3600)


def _timed(mode: str, layers: int, work: Path, scratch: Path, cache_dir: Path | None = None) -> dict | None:
    started = time.perf_counter()
    proc = _run(mode, layers, work, scratch, cache_dir=cache_dir)
    total = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"  [{layers} layers] {mode}: FAILED\n{proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return {**json.loads(lines[-1]), "total": total} if lines else {"total": total}


def _prepare(scenario: str, layers: int, work: Path, scratch: Path, warm: Path) -> None:
    mode = {"compile-warm": "compile-prepare", "compile-mega": "compile-mega-prepare", "aoti": "aoti-prepare"}.get(
        scenario, f"{scenario}-prepare" if scenario in PRECOMPILE else None)
    if mode is None:
        return
    print(f"[{layers} layers] preparing {scenario}", file=sys.stderr)
    started = time.perf_counter()
    proc = _run(mode, layers, work, scratch, cache_dir=warm if scenario == "compile-warm" else None)
    if proc.returncode != 0:
        print(f"  {mode}: FAILED\n{proc.stderr.strip()[-2000:]}", file=sys.stderr)
    else:
        print(f"  {mode}: {time.perf_counter() - started:.1f} s", file=sys.stderr)


def measure(layers: int, scenarios: tuple[str, ...], repeat: int, top: int, profile: bool) -> tuple[dict, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="precompile-depth-") as scratch_name:
        scratch = Path(scratch_name)
        work, warm = scratch / "work", scratch / "warm-cache"
        work.mkdir()
        warm.mkdir()
        for scenario in scenarios:
            _prepare(scenario, layers, work, scratch, warm)
        runs: dict[str, list[dict]] = {s: [] for s in scenarios}
        for round_index in range(repeat):  # interleaved rounds, so drift hits every scenario alike
            for scenario in scenarios:
                print(f"[{layers} layers] {scenario} (round {round_index + 1})", file=sys.stderr)
                outcome = _timed(scenario, layers, work, scratch, warm if scenario == "compile-warm" else None)
                if outcome is not None:
                    runs[scenario].append(outcome)
        profiles = {}
        if profile:
            for scenario in scenarios:
                if scenario in PRECOMPILE and (work / f"{scenario}.py").exists():
                    proc = _run(f"{scenario}-profile", layers, work, scratch, str(top))
                    profiles[scenario] = proc.stdout if proc.returncode == 0 else proc.stderr[-2000:]
        sizes = {s: ((work / f"{s}.py").stat().st_size, (work / f"{s}.cache").stat().st_size)
                 for s in scenarios if s in PRECOMPILE and (work / f"{s}.py").exists()}
    keys = ("total", "after_import", "import_precompile", "load", "first_call")
    medians = {s: {k: statistics.median(r[k] for r in rs) for k in keys if k in rs[0]} | {"flags": rs[-1]}
               for s, rs in runs.items() if rs}
    return {"medians": medians, "sizes": sizes}, profiles


def report(results: dict[int, dict], scenarios: tuple[str, ...]) -> list[str]:
    lines = ["", "== fresh process to first result, median (s); import pc = import precompile.serve.load; load = precompile.load() ==",
             f"{'layers':>6}  {'scenario':<16}{'total':>8}{'/eager':>8}{'after import':>14}{'import pc':>11}{'load':>8}"
             f"{'1st call':>10}  python_code / cache bytes, served from cache"]
    for layers, measured in results.items():
        medians, sizes = measured["medians"], measured["sizes"]
        eager = medians.get("eager", {}).get("total")
        for scenario in scenarios:
            row = medians.get(scenario)
            if row is None:
                lines.append(f"{layers:>6}  {scenario:<16}{'failed':>8}")
                continue
            ratio = f"{row['total'] / eager:.2f}" if eager else "-"
            extra = ""
            if scenario in sizes:
                flags = row["flags"]
                extra = (f"  {sizes[scenario][0]} / {sizes[scenario][1]}, bytecode {'yes' if flags.get('bytecode_from_cache') else 'no'},"
                         f" metadata {'yes' if flags.get('metadata_from_cache') else 'no'}")
            lines.append(
                f"{layers:>6}  {scenario:<16}{row['total']:>8.2f}{ratio:>8}{row['after_import']:>14.3f}"
                + (f"{row['import_precompile']:>11.3f}{row['load']:>8.3f}{row['first_call']:>10.3f}" if "load" in row else f"{'':>29}")
                + extra
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="1,4,16,48")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset (default: all)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--top", type=int, default=12, help="profile entries to print per precompile scenario")
    args = parser.parse_args()
    wanted = args.scenarios.split(",")
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    scenarios = tuple(s for s in SCENARIOS if s in wanted)
    layer_counts = [int(n) for n in args.layers.split(",")]
    results, profiles = {}, {}
    for layers in layer_counts:
        results[layers], found = measure(layers, scenarios, args.repeat, args.top, profile=layers == max(layer_counts))
        profiles.update(found)
    lines = report(results, scenarios)
    for scenario, text in profiles.items():
        lines += ["", f"== cProfile of precompile.load(), {scenario}, {max(layer_counts)} layers (by own time) ==", text.strip()]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
