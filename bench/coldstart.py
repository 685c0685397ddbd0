"""Cold start, side by side in one run: how long a fresh process takes to its first result.

Every scenario runs in a fresh process with its own empty Inductor cache dir and TMPDIR (where
Inductor keeps precompiled headers), on the built-in demo transformer and on a small MLP:

  eager              import torch, build the model, first call
  compile-cold       torch.compile, nothing cached
  compile-warm       torch.compile with the local cache a previous process filled
  compile-mega       torch.compile primed by load_cache_artifacts() from save_cache_artifacts()
  aoti               aoti_load_package() of a package aoti_compile_and_package() wrote
  precompile         precompile.load() of a captured pair + first call (the kernel bundle primes)
  precompile-nocache precompile.load() with the cache file missing (python_code JIT-compiles)
  dynamo             precompile.load() of a DynamoTracer pair (backend="inductor") + first call
  dynamo-eager       precompile.load() of a DynamoTracer pair (backend="eager") + first call
  precompile-venv2   "precompile", served from another venv at another path with the same torch build
  dynamo-venv2       "dynamo", served from that other venv (the bundles are keyed on the build, not paths)

Each row reports the whole process (start to first result, as the parent measured it) and the
part after `import torch`, as ratios to eager's and to precompile's, and which compiler modules
(torch._dynamo, torch._inductor, AOTAutograd) the process had imported by its first result. A second
table measures steady-state latency per call (eager, torch.compile, the served artifact) in one process.

    python bench/coldstart.py [--repeat 3] [--device cpu|cuda] [--models demo,mlp]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = ("eager", "compile-cold", "compile-warm", "compile-mega", "aoti", "precompile", "precompile-nocache",
             "dynamo", "dynamo-eager", "precompile-venv2", "dynamo-venv2")
ELSEWHERE = "-venv2"  # the scenario without this suffix, run by the second venv's python
COLD = {"compile-cold", "precompile-nocache"}  # minutes of compiling each: run once

# ---------------------------------------------------------------------------------------------
# Child side: one scenario, one process. Prints a JSON line with the time after `import torch`.

CHILD = r"""
import json, sys, time
started = time.perf_counter()
import torch
imported = time.perf_counter()
mode, model_name, device, work = sys.argv[1:5]
sys.path.insert(0, sys.argv[5])
from bench.coldstart import build

model, x = build(model_name, device)

def finish(y):
    if device == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    loaded = [name for name in ("torch._dynamo", "torch._inductor", "torch._functorch.aot_autograd") if name in sys.modules]
    print(json.dumps({"after_import": done - imported, "import": imported - started, "loaded": loaded}))

with torch.no_grad():
    if mode == "eager":
        finish(model(x))
    elif mode in ("compile-cold", "compile-warm", "compile-prepare"):
        finish(torch.compile(model)(x))
    elif mode == "compile-mega-prepare":
        torch.compile(model)(x)
        blob, _ = torch.compiler.save_cache_artifacts()
        open(work + "/mega.bin", "wb").write(blob)
    elif mode == "compile-mega":
        torch.compiler.load_cache_artifacts(open(work + "/mega.bin", "rb").read())
        finish(torch.compile(model)(x))
    elif mode == "aoti-prepare":
        program = torch.export.export(model, (x,))
        torch._inductor.aoti_compile_and_package(program, package_path=work + "/model.pt2")
    elif mode == "aoti":
        finish(torch._inductor.aoti_load_package(work + "/model.pt2")(x))
    elif mode == "precompile-prepare":
        import precompile
        from precompile.examples.transformer import run
        with precompile.capture(run, artifact_path=work + "/m.py", cache_path=work + "/m.cache",
                                tracer=precompile.MakeFxTracer()) as cap:
            cap(model, x)
    elif mode == "dynamo-prepare":
        import precompile
        from precompile.examples.transformer import run
        for backend, name in (("inductor", "d"), ("eager", "de")):
            with precompile.capture(run, artifact_path=f"{work}/{name}.py", cache_path=f"{work}/{name}.cache",
                                    backend=backend) as cap:
                cap(model, x)
    elif mode in ("dynamo", "dynamo-eager"):
        import precompile
        name = "d" if mode == "dynamo" else "de"
        finish(precompile.load(f"{work}/{name}.py", f"{work}/{name}.cache")(model, x))
    elif mode in ("precompile", "precompile-nocache"):
        import warnings
        import precompile
        warnings.simplefilter("ignore", precompile.PrecompileWarning)
        cache = work + ("/m.cache" if mode == "precompile" else "/absent.cache")
        finish(precompile.load(work + "/m.py", cache)(model, x))
"""

STEADY = r"""
import json, statistics, sys, time, warnings
import torch
model_name, device, work = sys.argv[1:4]
sys.path.insert(0, sys.argv[4])
from bench.coldstart import build
import precompile
warnings.simplefilter("ignore", precompile.PrecompileWarning)
model, x = build(model_name, device)
served = precompile.load(work + "/m.py", work + "/m.cache")
compiled = torch.compile(model)
runs = {"eager": lambda: model(x), "torch.compile": lambda: compiled(x), "precompile": lambda: served(model, x)}
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
with torch.no_grad():
    for fn in runs.values():
        for _ in range(20):
            fn()
    samples = {name: [] for name in runs}
    for _ in range(15):  # interleaved rounds, so drift hits every contender alike
        for name, fn in runs.items():
            sync(); t = time.perf_counter()
            for _ in range(50):
                fn()
            sync(); samples[name].append((time.perf_counter() - t) / 50)
print(json.dumps({name: statistics.median(v) for name, v in samples.items()}))
"""


def build(name: str, device: str):
    """The benchmark's models, identical in every process."""
    import torch

    from precompile.examples.transformer import make_demo

    if name == "demo":
        model, x = make_demo()
    else:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64)).eval()
        x = torch.randn(8, 64)
    return model.to(device), x.to(device)


# ---------------------------------------------------------------------------------------------
# Parent side.


def byte_compile_precompile() -> None:
    """Write precompile's .pyc files, as installing a wheel does (torch's and the model libraries' come
    compiled): from a shell that sets PYTHONDONTWRITEBYTECODE, every child would otherwise compile
    precompile's sources anew (20-30 ms on a 2-core host), a cost no baseline pays and no install has."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "precompile")], check=True, timeout=300)


def _env(cache_dir: Path, tmp_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(TORCHINDUCTOR_CACHE_DIR=str(cache_dir), TMPDIR=str(tmp_dir), TRITON_CACHE_DIR=str(cache_dir / "triton"))
    env.pop("TORCH_PRECOMPILE_NO_COMPILATION", None)
    return env


def _second_venv(root: Path) -> str:
    """The python of a second virtualenv at another path holding this one's packages, hard-linked
    (copied across filesystems): the same torch build installed elsewhere, as on a serving host."""
    venv = root / "venv2"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    here = sysconfig.get_paths()["purelib"]
    there = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if subprocess.run(["cp", "-al", f"{here}/.", str(there)], capture_output=True, timeout=600).returncode != 0:
        shutil.copytree(here, there, symlinks=True, dirs_exist_ok=True)
    return str(venv / "bin" / "python")


def _run(mode: str, model: str, device: str, work: Path, cache_dir: Path, tmp_dir: Path,
         python: str = sys.executable) -> dict | None:
    for directory in (cache_dir, tmp_dir):
        directory.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    proc = subprocess.run(
        [python, "-c", CHILD, mode, model, device, str(work), str(ROOT)],
        capture_output=True, text=True, env=_env(cache_dir, tmp_dir), timeout=1800,
    )
    total = time.perf_counter() - started
    if proc.returncode != 0:
        print(f"  {mode}: FAILED\n{proc.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return {**json.loads(lines[-1]), "total": total} if lines else {"total": total}


# What each scenario needs prepared first ("venv2": the second venv).
_PREPARES = {"compile-mega": "compile-mega-prepare", "aoti": "aoti-prepare", "precompile": "precompile-prepare",
             "precompile-nocache": "precompile-prepare", "dynamo": "dynamo-prepare", "dynamo-eager": "dynamo-prepare",
             "precompile-venv2": "precompile-prepare", "dynamo-venv2": "dynamo-prepare"}


def measure(model: str, device: str, repeat: int, scenarios: tuple[str, ...] = SCENARIOS) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="precompile-coldstart-") as scratch:
        root = Path(scratch)
        work = root / "work"
        work.mkdir()
        fresh = iter(range(10**6))

        def isolated(mode, python=sys.executable):  # its own empty cache dir and TMPDIR
            n = next(fresh)
            return _run(mode, model, device, work, root / f"cache{n}", root / f"tmp{n}", python)

        print(f"[{model}] preparing: warm cache, mega-cache blob, AOTInductor package, precompile pairs", file=sys.stderr)
        warm_cache, warm_tmp = root / "warm-cache", root / "warm-tmp"
        _run("compile-prepare", model, device, work, warm_cache, warm_tmp)  # the steady-state table needs it
        for prepare in dict.fromkeys(_PREPARES[s] for s in scenarios if s in _PREPARES):
            isolated(prepare)
        elsewhere = _second_venv(root) if any(s.endswith(ELSEWHERE) for s in scenarios) else None

        results: dict[str, list[dict]] = {s: [] for s in scenarios}
        for round_index in range(repeat):
            for scenario in scenarios:
                if scenario in COLD and round_index > 0:
                    continue
                print(f"[{model}] {scenario} (round {round_index + 1})", file=sys.stderr)
                if scenario == "compile-warm":
                    outcome = _run(scenario, model, device, work, warm_cache, warm_tmp)
                elif scenario.endswith(ELSEWHERE):
                    outcome = isolated(scenario[: -len(ELSEWHERE)], elsewhere)
                else:
                    outcome = isolated(scenario)
                if outcome is not None:
                    results[scenario].append(outcome)
        steady = subprocess.run(
            [sys.executable, "-c", STEADY, model, device, str(work), str(ROOT)],
            capture_output=True, text=True, env=_env(warm_cache, warm_tmp), timeout=1800,
        )
        per_call = json.loads(steady.stdout.strip().splitlines()[-1]) if steady.returncode == 0 else {}
        if steady.returncode != 0:
            print(steady.stderr[-2000:], file=sys.stderr)
    medians = {
        scenario: {key: statistics.median(r[key] for r in runs) for key in ("total", "after_import")}
        for scenario, runs in results.items()
        if runs
    }
    loaded = {scenario: runs[-1].get("loaded", []) for scenario, runs in results.items() if runs}
    return {"cold": medians, "loaded": loaded, "per_call": per_call, "scenarios": scenarios}


def report(model: str, measured: dict) -> list[str]:
    cold, per_call = measured["cold"], measured["per_call"]
    eager, ours = cold.get("eager"), cold.get("precompile")
    lines = [f"\n== {model}: fresh process to first result (median) ==",
             f"{'scenario':<20}{'total s':>9}{'after import s':>16}{'total/eager':>13}{'after/eager':>13}"
             f"{'total/precomp':>15}{'after/precomp':>15}  compiler modules in sys.modules after"]
    for scenario in measured["scenarios"]:
        row = cold.get(scenario)
        if row is None:
            lines.append(f"{scenario:<20}{'failed':>9}")
            continue
        ratios = [row["total"] / eager["total"], row["after_import"] / eager["after_import"]] if eager else [0, 0]
        ratios += [row["total"] / ours["total"], row["after_import"] / ours["after_import"]] if ours else [0, 0]
        lines.append(f"{scenario:<20}{row['total']:>9.2f}{row['after_import']:>16.3f}{ratios[0]:>13.2f}{ratios[1]:>13.1f}"
                     f"{ratios[2]:>15.2f}{ratios[3]:>15.1f}  {', '.join(measured['loaded'][scenario]) or '-'}")
    if per_call:
        lines.append("-- steady state per call: " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in per_call.items()))
    warm = cold.get("compile-warm")
    if warm and ours and eager:
        lines.append(
            f"-- targets: after-import speed-up over torch.compile warm = {warm['after_import'] / ours['after_import']:.1f}x "
            f"(>= 5x); whole process vs eager = {ours['total'] / eager['total']:.2f}x (<= 1.5x)"
            + (f"; per call precompile/torch.compile = {per_call['precompile'] / per_call['torch.compile']:.2f} (<= 1)" if per_call else "")
        )
    for scenario in ("dynamo", "dynamo-eager"):
        row = cold.get(scenario)
        if row and warm and eager:
            lines.append(
                f"-- targets, {scenario}: after import / torch.compile warm = {row['after_import'] / warm['after_import']:.2f} "
                f"(<= 0.2); whole process / eager = {row['total'] / eager['total']:.2f} (<= 1.3)"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the fast scenarios (default 3)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--models", default="demo,mlp")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help="comma-separated subset of the scenarios above, in this order (default: all)")
    args = parser.parse_args()
    scenarios = tuple(s for s in SCENARIOS if s in args.scenarios.split(","))
    unknown = set(args.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    byte_compile_precompile()
    lines = []
    for model in args.models.split(","):
        lines += report(model, measure(model, args.device, args.repeat, scenarios))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
