"""Cold start against depth, side by side in one run: does load stay flat as the model gets deeper?

A decoder-only stack (`precompile.examples.transformer.TinyTransformer`: width 256, 4 heads, MLP
1024, sequence 64, batch 2) at each layer count, every scenario in a fresh process with its own empty
Inductor cache dir and TMPDIR (as in bench/coldstart.py). Every child does the same work around the
part a scenario is about: start Python, `import torch`, build the model and input with `build()`
(same seed, same weights, same input), then under `torch.no_grad()` (the served artifacts run
their graph under no_grad themselves, so eager gets the same grad mode, and nobody builds autograd
state) produce the first result, then time steady-state calls of that same callable:

  eager                     model(x)
  compile-warm              torch.compile(model)(x), with the local cache a previous process filled
  compile-mega              the same, primed by load_cache_artifacts() from save_cache_artifacts()
  aoti                      aoti_load_package(...)(x) of a package aoti_compile_and_package() wrote
                            (the built model goes unused: the package holds its weights)
  makefx-eager, makefx-inductor, dynamo-eager, dynamo-inductor
                            import precompile.serve.load, precompile.load() of a pair captured with
                            that tracer and backend, then served(model, x)
  upstream-eager, upstream-inductor
                            the same through torch 2.15's own torch.compiler.precompile (capture, then
                            load; its "import" is `import torch.compiler.precompile`): bench/upstream.py
                            runs them beside ours, and a capture's seconds are measured in its own process

Columns: `total` is the whole process from its start to the first result (the parent's clock, up to
the line the child prints and flushes at its first result, so teardown and the per-call timing
after it are excluded), and its ratio to eager's; `after import` the same from the end of
`import torch` (import torch is identical work in every child, and on a busy host the noisiest
part), and its ratio to eager's; for precompile: importing it (`precompile.serve.load`, after the
model is built), the load part (`precompile.load()`) and the first call; `gc2` the seconds of full
(generation 2) collections the process ran after `import torch` and before its first result: a
process-wide debt every child carries in from torch's import and the model's build, paid by whichever
allocates past the collector's threshold before its first result (at 48 layers eager's first call
does not; a MakeFx artifact's first call, which builds its per-parameter checks, does);
`per call` the median of `--calls` calls after 3 warm-up calls, in the same process. Then, for the
deepest layer count, the top entries of a cProfile of `precompile.load()` per precompile scenario
(a fresh process each).

Threads: `--threads N` sets OMP_NUM_THREADS for every child, preparation included (Inductor bakes
the thread count into its kernels), default 1. On a small shared host a parallel region waits for
every one of its threads, so a core another process holds makes each op wait out a time slice: at 2
threads on a busy 2-core host a 48-layer forward took 2-10 s instead of 0.35 s, in any scenario,
which buries everything this bench measures. Pass `--threads 0` for torch's default on a quiet,
dedicated machine.

    python bench/depth.py [--layers 1,4,16,48] [--scenarios ...] [--repeat 3] [--calls 15] [--top 12]
                          [--threads 1] [--work DIR]

Preparation (captures, torch.compile's warm cache, the Mega-Cache blob, the AOTInductor package)
takes minutes at 48 layers on a small machine and measures nothing: `--work DIR` keeps it in
DIR/L<layers>-t<threads>/ and reuses what is there, so it can run early (on a busy host) and the
measurement later. Pick layer counts and scenarios with the flags (e.g. `--layers 1,16 --scenarios
eager,makefx-eager,dynamo-eager,dynamo-inductor`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.coldstart import _env, byte_compile_precompile

PRECOMPILE = ("makefx-eager", "makefx-inductor", "dynamo-eager", "dynamo-inductor")
SCENARIOS = ("eager", "compile-warm", "compile-mega", "aoti", *PRECOMPILE)
UPSTREAM = ("upstream-eager", "upstream-inductor")
"""torch 2.15's own torch.compiler.precompile (MakeFx only), served like ours: bench/upstream.py runs them."""
PAIRED = (*PRECOMPILE, *UPSTREAM)
WARMUP = 3

CHILD = r"""
import gc, json, sys, time
started = time.perf_counter()
import torch
imported = time.perf_counter()
full = [0, 0.0, None]  # full collections after import torch: count, seconds, start of the one running

def _collections(phase, info):
    if info["generation"] == 2:
        if phase == "start":
            full[2] = time.perf_counter()
        elif full[2] is not None:
            full[0] += 1
            full[1] += time.perf_counter() - full[2]

gc.callbacks.append(_collections)
mode, layers, work, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
sys.path.insert(0, sys.argv[4])
from bench.depth import build

model, x = build(layers)
out = {}

def finish(fn):
    "First result (printed and flushed at once: the parent stops its clock there), then steady-state calls."
    fn()
    done = time.perf_counter()
    gc.callbacks.remove(_collections)
    loaded = [n for n in ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd") if n in sys.modules]
    print(json.dumps({"after_import": done - imported, "import": imported - started, "loaded": loaded,
                      "gc2": full[1], "gc2_count": full[0], **out}), flush=True)
    for _ in range(""" + str(WARMUP) + r"""):
        fn()
    samples = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    samples.sort()
    print(json.dumps({"per_call": samples[len(samples) // 2] if samples else None}), flush=True)

with torch.no_grad():
    if mode == "eager":
        finish(lambda: model(x))
    elif mode in ("compile-warm", "compile-prepare"):
        compiled = torch.compile(model)
        finish(lambda: compiled(x))
    elif mode == "compile-mega-prepare":
        torch.compile(model)(x)
        open(f"{work}/mega.bin", "wb").write(torch.compiler.save_cache_artifacts()[0])
    elif mode == "compile-mega":
        torch.compiler.load_cache_artifacts(open(f"{work}/mega.bin", "rb").read())
        compiled = torch.compile(model)
        finish(lambda: compiled(x))
    elif mode == "aoti-prepare":
        torch._inductor.aoti_compile_and_package(torch.export.export(model, (x,)), package_path=f"{work}/model.pt2")
    elif mode == "aoti":
        package = torch._inductor.aoti_load_package(f"{work}/model.pt2")
        finish(lambda: package(x))
    elif mode.endswith("-prepare"):
        import precompile
        from precompile.examples.transformer import run
        tracer, backend = mode[: -len("-prepare")].split("-")
        paths = {"artifact_path": f"{work}/{tracer}-{backend}.py", "cache_path": f"{work}/{tracer}-{backend}.cache"}
        if tracer == "upstream":
            import torch.compiler.precompile as upstream
            t0 = time.perf_counter()
            with upstream.capture(run, **paths, backend=backend) as cap:
                cap(model, x)
        else:
            t0 = time.perf_counter()
            with precompile.capture(run, **paths, tracer=precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer(),
                                    backend=backend) as cap:
                cap(model, x)
        print(json.dumps({"capture": time.perf_counter() - t0}), flush=True)
    elif mode.endswith("-profile"):
        import cProfile, io, pstats
        import precompile, precompile.serve.load
        name = mode[: -len("-profile")]
        profile = cProfile.Profile()
        profile.enable()
        served = precompile.load(f"{work}/{name}.py", f"{work}/{name}.cache")
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(int(sys.argv[6]))
        print(text.getvalue())
    else:
        t0 = time.perf_counter()
        if mode.startswith("upstream-"):
            import torch.compiler.precompile as loader
        else:
            import precompile as loader
            import precompile.serve.load  # `import precompile` alone is lazy
        t1 = time.perf_counter()
        served = loader.load(f"{work}/{mode}.py", f"{work}/{mode}.cache")
        t2 = time.perf_counter()
        out = {"import_precompile": t1 - t0, "load": t2 - t1,
               "bytecode_from_cache": getattr(served, "bytecode_from_cache", None),
               "metadata_from_cache": getattr(served, "metadata_from_cache", None)}

        def first_and_later():
            if "first_call" not in out:
                y = served(model, x)
                out["first_call"] = time.perf_counter() - t2
                return y
            return served(model, x)

        finish(first_and_later)
"""


def build(layers: int):
    """The benchmark's model and input at `layers` layers, identical in every process."""
    import torch

    from precompile.examples.transformer import TinyTransformer

    torch.manual_seed(0)
    model = TinyTransformer(width=256, heads=4, hidden=1024, layers=layers).eval()
    return model, torch.randn(2, 64, 256, generator=torch.Generator().manual_seed(1))


def _child_env(cache_dir: Path, tmp_dir: Path, threads: int) -> dict[str, str]:
    env = _env(cache_dir, tmp_dir)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _run(mode: str, layers: int, work: Path, scratch: Path, threads: int, *extra: str, calls: int = 0,
         cache_dir: Path | None = None) -> tuple[int, list[str], str, float | None]:
    """Run one child: (exit status, its JSON lines, the end of its stderr, seconds from start to its first line)."""
    cache_dir = cache_dir or Path(tempfile.mkdtemp(prefix="cache-", dir=scratch))
    tmp_dir = Path(tempfile.mkdtemp(prefix="tmp-", dir=scratch))
    with tempfile.TemporaryFile("w+", dir=scratch) as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, str(layers), str(work), str(ROOT), str(calls), *extra],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=_child_env(cache_dir, tmp_dir, threads))
        first, lines = None, []
        for line in proc.stdout:
            if first is None and line.startswith("{"):
                first = time.perf_counter() - started
            lines.append(line)
        proc.wait(timeout=3600)
        err.seek(0)
        return proc.returncode, lines, err.read()[-3000:], first


def _timed(mode: str, layers: int, work: Path, scratch: Path, threads: int, calls: int, cache_dir: Path | None = None) -> dict | None:
    code, lines, err, first = _run(mode, layers, work, scratch, threads, calls=calls, cache_dir=cache_dir)
    records = [json.loads(line) for line in lines if line.startswith("{")]
    if code != 0 or not records or first is None:
        print(f"  [{layers} layers] {mode}: FAILED\n{err.strip()[-2000:]}", file=sys.stderr)
        return None
    merged = {k: v for record in records for k, v in record.items()}
    return {**merged, "total": first}


def _prepared(scenario: str, work: Path) -> bool:
    return {"compile-warm": (work / "warm-cache.done").exists(), "compile-mega": (work / "mega.bin").exists(),
            "aoti": (work / "model.pt2").exists()}.get(scenario, (work / f"{scenario}.cache").exists())


def _prepare(scenario: str, layers: int, work: Path, scratch: Path, threads: int) -> float | None:
    """Prepare a scenario in a fresh process; for a capture, the seconds its `with capture(...)` block took."""
    mode = {"compile-warm": "compile-prepare", "compile-mega": "compile-mega-prepare", "aoti": "aoti-prepare"}.get(
        scenario, f"{scenario}-prepare" if scenario in PAIRED else None)
    if mode is None:
        return None
    if _prepared(scenario, work):
        print(f"[{layers} layers] {scenario}: prepared already in {work}", file=sys.stderr)
        return None
    print(f"[{layers} layers] preparing {scenario}", file=sys.stderr)
    started = time.perf_counter()
    code, lines, err, _ = _run(mode, layers, work, scratch, threads, calls=0,
                               cache_dir=work / "warm-cache" if scenario == "compile-warm" else None)
    if code != 0:
        print(f"  {mode}: FAILED\n{err.strip()[-2000:]}", file=sys.stderr)
        return None
    if scenario == "compile-warm":
        (work / "warm-cache.done").touch()
    print(f"  {mode}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return next((json.loads(line)["capture"] for line in lines if line.startswith('{"capture"')), None)


def measure(layers: int, scenarios: tuple[str, ...], repeat: int, calls: int, top: int, profile: bool, threads: int,
            keep: Path | None) -> tuple[dict, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="precompile-depth-") as scratch_name:
        scratch = Path(scratch_name)
        work = (keep / f"L{layers}-t{threads}") if keep else scratch / "work"
        (work / "warm-cache").mkdir(parents=True, exist_ok=True)
        captures = {scenario: _prepare(scenario, layers, work, scratch, threads) for scenario in scenarios}
        if repeat == 0:
            return {"medians": {}, "sizes": {}, "captures": captures}, {}
        runs: dict[str, list[dict]] = {s: [] for s in scenarios}
        for round_index in range(repeat):  # interleaved rounds, so drift hits every scenario alike
            for scenario in scenarios:
                print(f"[{layers} layers] {scenario} (round {round_index + 1})", file=sys.stderr)
                outcome = _timed(scenario, layers, work, scratch, threads, calls,
                                 work / "warm-cache" if scenario == "compile-warm" else None)
                if outcome is not None:
                    runs[scenario].append(outcome)
        profiles = {}
        if profile:
            for scenario in scenarios:
                if scenario in PRECOMPILE and (work / f"{scenario}.py").exists():
                    code, lines, err, _ = _run(f"{scenario}-profile", layers, work, scratch, threads, str(top))
                    profiles[scenario] = "".join(lines) if code == 0 else err[-2000:]
        sizes = {s: ((work / f"{s}.py").stat().st_size, (work / f"{s}.cache").stat().st_size)
                 for s in scenarios if s in PAIRED and (work / f"{s}.py").exists()}
    keys = ("total", "after_import", "import_precompile", "load", "first_call", "gc2", "per_call")
    medians = {s: {k: statistics.median(r[k] for r in rs) for k in keys if k in rs[0] and rs[0][k] is not None}
               | {"flags": rs[-1], "runs": len(rs)}
               for s, rs in runs.items() if rs}
    return {"medians": medians, "sizes": sizes, "captures": captures}, profiles


def report(results: dict[int, dict], scenarios: tuple[str, ...]) -> list[str]:
    lines = ["", "== fresh process to first result, median (s); import pc = import precompile.serve.load; load = precompile.load();"
             " gc2 = full collections before the first result; per call = steady state (ms) ==",
             f"{'layers':>6}  {'scenario':<16}{'total':>7}{'/eager':>7}{'after import':>13}{'/eager':>7}{'import pc':>10}"
             f"{'load':>7}{'1st call':>9}{'gc2':>6}{'per call':>9}{'/compile':>9}  python_code / cache bytes, served from cache"]
    for layers, measured in results.items():
        medians, sizes = measured["medians"], measured["sizes"]
        eager = medians.get("eager", {})
        compiled = medians.get("compile-warm", {}).get("per_call")
        for scenario in scenarios:
            row = medians.get(scenario)
            if row is None:
                lines.append(f"{layers:>6}  {scenario:<16}{'failed':>7}")
                continue
            ratio = f"{row['total'] / eager['total']:.2f}" if eager.get("total") else "-"
            after_ratio = f"{row['after_import'] / eager['after_import']:.2f}" if eager.get("after_import") else "-"
            per_call = f"{row['per_call'] * 1e3:.1f}" if row.get("per_call") else "-"
            per_ratio = f"{row['per_call'] / compiled:.2f}" if compiled and row.get("per_call") else "-"
            extra = ""
            if scenario in sizes:
                flags = row["flags"]
                extra = (f"  {sizes[scenario][0]} / {sizes[scenario][1]}, bytecode {'yes' if flags.get('bytecode_from_cache') else 'no'},"
                         f" metadata {'yes' if flags.get('metadata_from_cache') else 'no'}")
            lines.append(
                f"{layers:>6}  {scenario:<16}{row['total']:>7.2f}{ratio:>7}{row['after_import']:>13.3f}{after_ratio:>7}"
                + (f"{row['import_precompile']:>10.3f}{row['load']:>7.3f}{row['first_call']:>9.3f}" if "load" in row else f"{'':>26}")
                + f"{row.get('gc2', 0):>6.2f}{per_call:>9}{per_ratio:>9}" + extra
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="1,4,16,48")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (0: prepare only)")
    parser.add_argument("--calls", type=int, default=15, help="timed steady-state calls per process, after 3 warm-up calls")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of every child (0: torch's default)")
    parser.add_argument("--work", type=Path, help="keep (and reuse) the prepared artifacts here")
    parser.add_argument("--top", type=int, default=12, help="profile entries to print per precompile scenario")
    args = parser.parse_args()
    wanted = args.scenarios.split(",")
    unknown = set(wanted) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    scenarios = tuple(s for s in SCENARIOS if s in wanted)
    layer_counts = [int(n) for n in args.layers.split(",")]
    byte_compile_precompile()
    results, profiles = {}, {}
    for layers in layer_counts:
        results[layers], found = measure(layers, scenarios, args.repeat, args.calls, args.top, layers == max(layer_counts),
                                         args.threads, args.work.resolve() if args.work else None)
        profiles.update(found)
    if args.repeat == 0:
        return
    threads = f"OMP_NUM_THREADS={args.threads}" if args.threads > 0 else "torch's default threads"
    lines = [f"host: {os.cpu_count()} CPUs, load average {' '.join(f'{v:.1f}' for v in os.getloadavg())} at the end; {threads};"
             f" {args.repeat} round(s), per call median of {args.calls}"]
    lines += report(results, scenarios)
    for scenario, text in profiles.items():
        lines += ["", f"== cProfile of precompile.load(), {scenario}, {max(layer_counts)} layers (by own time) ==", text.strip()]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
