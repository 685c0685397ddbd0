"""Recapturing a zoo model elsewhere diffs equal: no release gate fails a rebuild where nothing changed.

Per model and tracer (eager backend), two fresh child processes capture the zoo model's step, as
`bench/zoo.py` does (a Dynamo capture also calls at a second shape), and differ in everything a
rebuild may change but what runs:

  cwd            two temporary directories
  PYTHONHASHSEED 0 vs 12345
  venv path      the second runs a hard-link copy of the venv (`cp -al`, made once), checked by sys.prefix
  first built    the second first builds and runs another zoo model (library registries fill in another order)
  source lines   each captures `step` from a module of the same name in its cwd that wraps the zoo's step
                 identically; the second's has three comment lines above `def step`

Then the documented gates (docs/inspect.md) run on the pair: `precompile diff A B` (exit 0: equal),
`verify B`, `diff --stat --fail-on guards,calling-convention,params,graph,versions` and
`diff --format markdown --fail-on guards,calling-convention,params,graph,kernels,versions --junit`.
One row per model and tracer: the serving mode capture chose, the verdict (`equal`, or the categories
that differ with their counts), each gate's exit code; for a difference, its first lines.

    python bench/recapture_equal.py [--models bert,gpt2] [--tracers dynamo,makefx] [--timeout 600]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(sys.prefix)
QUICK = ("bert", "distilbert", "gpt2", "tv_resnet18", "timm_resnet18d")
MODULE = "recapture_step"
COMMENT = "# A comment added above the captured function:\n# a rebuild that only moves code down\n# must diff equal.\n"
GATES = {  # name: the verb's arguments before the two sides (verify: the candidate only)
    "diff": ["diff"],
    "verify": ["verify"],
    "stat-gate": ["diff", "--stat", "--fail-on", "guards,calling-convention,params,graph,versions"],
    "md-gate": ["diff", "--format", "markdown", "--fail-on", "guards,calling-convention,params,graph,kernels,versions"],
}

CAPTURE = r"""
import json, re, sys
import torch
import precompile
from bench.zoo_models import ZOO
name, tracer, warm, out = sys.argv[1:5]
if warm:  # another zoo model built and run first: the libraries' registries fill in another order
    other, other_args = ZOO[warm].instantiate()
    with ZOO[warm].grad_mode():
        ZOO[warm].step(other, *other_args)
from recapture_step import step
zoo = ZOO[name]
model, args = zoo.instantiate()
try:
    with zoo.grad_mode(), precompile.capture(
        step, artifact_path=out + ".py", cache_path=out + ".cache", backend="eager",
        tracer=precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer(),
    ) as cap:
        for _ in range(zoo.capture_calls if tracer == "dynamo" else 1):
            cap(model, *args)
        if tracer == "dynamo":
            cap(model, *zoo.other_shape(args, 1))
except precompile.CaptureRefused as exc:
    if not any(t == tracer and re.search(pattern, str(exc)) for t, pattern in zoo.refused):
        raise
    print(json.dumps({"refused": str(exc)[:200], "prefix": sys.prefix}))
    sys.exit(0)
print(json.dumps({"prefix": sys.prefix}))
"""


def _wrapper(step_name: str, comment: str) -> str:
    return (f"from bench.zoo_models import {step_name} as zoo_step\n\n\n{comment}"
            "def step(model, *args):\n    return zoo_step(model, *args)\n")


def _child(python: Path, cwd: Path, seed: str, args: list[str], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": seed, "TRANSFORMERS_VERBOSITY": "error",
           "TORCHINDUCTOR_CACHE_DIR": str(cwd / "inductor")}
    started = time.perf_counter()
    try:
        proc = subprocess.run([str(python), "-c", CAPTURE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        return {"error": (lines or [f"exit {proc.returncode}"])[-1][:300]}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "s": time.perf_counter() - started}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "precompile", *args], capture_output=True, text=True, env=env)


def _serving_mode(artifact: Path) -> str:
    found = re.search(r"^SERVING_MODE = ['\"](\w+)['\"]", artifact.read_text(encoding="utf-8"), re.M)
    return found.group(1) if found else "?"


def compare(a: Path, b: Path, scratch: Path, lines: int) -> dict:
    """The verdict of `diff --json`, each gate's exit code, and the text diff's first lines."""
    report = json.loads(_cli("diff", "--json", str(a), str(b)).stdout)
    changed = {k: v for k, v in report.get("categories", {}).items() if v}
    exits = {}
    for gate, verb in GATES.items():
        extra = ["--junit", str(scratch / "junit.xml")] if gate == "md-gate" else []
        sides = [str(b)] if verb == ["verify"] else [str(a), str(b)]
        exits[gate] = _cli(*verb, *extra, *sides).returncode
    text = _cli("diff", "--context", "0", str(a), str(b)).stdout.splitlines()
    problems = report.get("problems", []) + [f"unpaired {side}" for side in report.get("unpaired", [])]
    verdict = "equal" if report.get("equal") else ", ".join(f"{k} ({v})" for k, v in changed.items()) or "differ"
    return {"verdict": "; ".join([verdict, *problems]), "exits": exits,
            "first_lines": [] if report.get("equal") else [_cut(line) for line in text[:lines]]}


def _cut(line: str, width: int = 400) -> str:
    return line if len(line) <= width else f"{line[:width]} ... ({len(line)} characters)"


def run(models: list[str], tracers: list[str], timeout: float, lines: int, root: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from bench.zoo_models import ZOO

    venv_b = root / "venv-b"
    started = time.perf_counter()
    shutil.copytree(VENV, venv_b, symlinks=True, copy_function=os.link)  # cp -al: hard links
    print(f"venv copy (hard links) {venv_b} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    sides = {"a": (VENV / "bin" / "python", "0", ""), "b": (venv_b / "bin" / "python", "12345", COMMENT)}
    rows = []
    for name in models:
        zoo = ZOO[name]
        missing = zoo.available()
        if missing:
            rows.append({"model": name, "skipped": missing})
            continue
        warm = "gpt2" if name == "bert" else "bert"
        for tracer in tracers:
            row = {"model": name, "tracer": tracer}
            outs, prefixes = {}, {}
            for side, (python, seed, comment) in sides.items():
                cwd = root / f"{name}-{tracer}-{side}"
                cwd.mkdir()
                (cwd / f"{MODULE}.py").write_text(_wrapper(zoo.step.__name__, comment), encoding="utf-8")
                outs[side] = cwd / "out" / name
                outs[side].parent.mkdir()
                result = _child(python, cwd, seed, [name, tracer, warm if side == "b" else "", str(outs[side])], timeout)
                if "error" in result or "refused" in result:
                    row.update({"verdict": f"{side}: {result.get('error') or 'refused: ' + result['refused']}"})
                    break
                prefixes[side] = result["prefix"]
                row[f"capture_{side}_s"] = result["s"]
            else:
                if prefixes["a"] == prefixes["b"]:
                    raise SystemExit(f"the second child ran in the same venv ({prefixes['a']}): nothing differs there")
                row["serving_mode"] = _serving_mode(outs["a"].with_suffix(".py"))
                row.update(compare(outs["a"], outs["b"], root, lines))
            rows.append(row)
            print(_line(row), file=sys.stderr)
    return rows


def _line(row: dict) -> str:
    if "skipped" in row:
        return f"{row['model']}: skipped ({row['skipped']})"
    exits = " ".join(f"{gate}={code}" for gate, code in row.get("exits", {}).items())
    return " | ".join([row["model"], row["tracer"], row.get("serving_mode", "-"), row.get("verdict", "-"), exits])


def table(rows: list[dict]) -> str:
    header = ["model", "tracer", "serving mode", "verdict", *GATES, "capture s (a, b)"]
    cells = [header]
    for row in rows:
        if "skipped" in row:
            continue
        exits = row.get("exits", {})
        times = ", ".join(f"{row[k]:.0f}" for k in ("capture_a_s", "capture_b_s") if k in row)
        cells.append([row["model"], row["tracer"], row.get("serving_mode", "-"), row.get("verdict", "-"),
                      *(str(exits.get(gate, "-")) for gate in GATES), times])
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in cells]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        if "skipped" in row:
            out.append(_line(row))
        elif row.get("first_lines"):
            out += ["", f"{row['model']} {row['tracer']}: first lines of `precompile diff`", *row["first_lines"]]
    return "\n".join(out)


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    from bench.zoo_models import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(QUICK), help="comma-separated, from: " + ", ".join(ZOO))
    parser.add_argument("--tracers", default="dynamo,makefx")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per capturing child")
    parser.add_argument("--lines", type=int, default=12, help="first lines of the text diff shown per difference")
    parser.add_argument("--out", type=Path, default=None, help="keep the children's dirs and pairs here (default: a temporary dir)")
    options = parser.parse_args(argv)
    models = [m for m in options.models.split(",") if m]
    tracers = [t for t in options.tracers.split(",") if t]
    for option, values, known in (("models", models, tuple(ZOO)), ("tracers", tracers, ("dynamo", "makefx"))):
        unknown = [value for value in values if value not in known]
        if unknown:
            parser.error(f"unknown {option} {unknown}; choose from {list(known)}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="recapture-") as scratch:
        root = options.out or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        rows = run(models, tracers, options.timeout, options.lines, root)
    print(f"torch {__import__('torch').__version__}, {len(rows)} rows in {time.perf_counter() - started:.0f} s\n")
    print(table(rows))
    failed = [row for row in rows if "skipped" not in row
              and (row.get("verdict") != "equal" or any(row.get("exits", {}).values()))]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
