"""The model zoo: real models, both tracers, both backends, captured then served in a fresh process.

Per model x tracer x backend: one process captures the pair (capture time); then, once every pair of
the model is captured, a fresh process per serving order loads it under `precompile.no_compilation()`
and compares with eager (the tracers' pairs of one backend and order served in turn, side by side):

  load-first  load the pair before the model's library is imported, then build the model and call
  load-after  build the model first (its library imported), then load and call

A Dynamo capture makes one more call at another shape (every batch one larger, token ids two
longer: `ZooModel.other_shape`), as serving varying batches needs: Dynamo's automatic dynamic shapes
record a variant with those dims dynamic. Each serve row also tries a third shape (`other_shape`:
ok, differs, or what refused it); the summary's last column says, per tracer, whether the first and
the other shape served.

Each serve row records load time, first-call time, steady per-call time (median), the largest
difference to eager (over `--serve-runs` fresh processes, 3 by default: the median of each time, the
largest difference), and which of torch._dynamo / torch._inductor the load and the first call imported
(not those the model's library imports itself when the model is built; `library_imported_by_load`
says whether loading before the model was built imported the model's library, and what it imports).
`--compile-ref` adds torch.compile (inductor) cold time per model, in its own fresh process with an
empty Inductor cache, as the reference a capture is measured against, and eager's first call in a
fresh process (the median of `--serve-runs`), the one a precompiled load + first call is measured against. `--capture-runs N`
captures in N rounds, each torch.compile's cold run and then every capture in turn: a capture's ratio
to torch.compile is the median of its rounds' ratios, each over the reference run of its own round.
Models come from `bench/zoo_models.py` (tiny configs, random weights, nothing downloaded); a model
whose library does not import is skipped with the reason, and a model the zoo documents a refusal for
(a tracer that cannot capture it faithfully) passes that cell when capture refuses it so.
`--real-size` runs the real-size models instead (GPT-2 124M, ResNet-50 at 224x224) with
`--compile-ref`; the capture table gives each pair's python_code and cache sizes.

    python bench/zoo.py [--models bert,gpt2] [--tracers dynamo,makefx] [--backends eager,inductor]
                        [--orders load-first,load-after] [--compile-ref] [--capture-runs 2]
                        [--serve-runs 3] [--json zoo.json] [--real-size]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CAPTURE = r"""
import json, logging, os, re, sys, time
import torch
import precompile
from bench.zoo_models import ZOO, timed_cpp_builds
cpp = timed_cpp_builds()
name, tracer, backend, artifact, cache = sys.argv[1:6]
zoo = ZOO[name]
model, args = zoo.instantiate()
phases = {}

class Phases(logging.Handler):
    # The capture's own phase log ("capture: %s ..." / "capture: %s done in %.2f s"), as each phase's
    # exclusive seconds: a phase run inside another (freeze inside render) counts once.
    nested = [0.0]

    def emit(self, record):
        if record.msg == "capture: %s ...":
            self.nested.append(0.0)
        elif record.msg == "capture: %s done in %.2f s":
            phase, seconds = record.args
            inner = self.nested.pop()
            self.nested[-1] += seconds
            phases[phase] = phases.get(phase, 0.0) + seconds - inner

logging.getLogger("precompile").addHandler(Phases())
logging.getLogger("precompile").setLevel(logging.INFO)
started = time.perf_counter()
try:
    with zoo.grad_mode(), precompile.capture(
        zoo.step, artifact_path=artifact, cache_path=cache, backend=backend,
        tracer=precompile.MakeFxTracer() if tracer == "makefx" else precompile.DynamoTracer(),
    ) as cap:
        for _ in range(zoo.capture_calls if tracer == "dynamo" else 1):
            out = cap(model, *args)
        if tracer == "dynamo":  # a second shape: Dynamo records a variant with the changed dims dynamic
            cap(model, *zoo.other_shape(args, 1))
except precompile.CaptureRefused as exc:  # a refusal the zoo documents for this model is its outcome
    if not any(t == tracer and re.search(pattern, str(exc)) for t, pattern in zoo.refused):
        raise
    print(json.dumps({"refused": str(exc)[:300]}))
    sys.exit(0)
capture_s = time.perf_counter() - started
with zoo.grad_mode():
    expected = zoo.step(model, *args)
print(json.dumps({"capture_s": capture_s, "capture_diff": (out - expected).abs().max().item(),
                  "capture_phases": phases, "cpp_builds": cpp["builds"], "cpp_build_s": cpp["s"],
                  "python_code_bytes": os.path.getsize(artifact), "cache_bytes": os.path.getsize(cache)}))
"""

SERVE = r"""
import json, statistics, sys, time
import torch
import precompile
from bench.zoo_models import ZOO
name, order, artifact, cache, tracer = sys.argv[1:6]
WATCHED = ("torch._dynamo", "torch._inductor")
zoo = ZOO[name]
if order == "load-after":
    model, args = zoo.instantiate()
def loaded():
    return {m for m in WATCHED if m in sys.modules}
before = loaded()
started = time.perf_counter()
served = precompile.load(artifact, cache)
load_s = time.perf_counter() - started
imported = loaded() - before
library_imported_by_load = order == "load-first" and zoo.library in sys.modules
if order == "load-first":
    model, args = zoo.instantiate()
other = zoo.other_shape(args, 2)  # a shape no capture call had
with zoo.grad_mode():
    other_expected = zoo.step(model, *other)
with zoo.serve_mode(tracer), precompile.no_compilation():
    before = loaded()  # what the model's library imported itself is not the load's doing
    started = time.perf_counter()
    out = served(model, *args)
    first_s = time.perf_counter() - started
    imported = sorted(imported | (loaded() - before))
    steady = []
    for _ in range(10):
        started = time.perf_counter()
        served(model, *args)
        steady.append(time.perf_counter() - started)
    try:
        other_diff = (served(model, *other) - other_expected).abs().max().item()
        other_shape = "ok" if other_diff <= 1e-3 else f"differs {other_diff:.1e}"
    except Exception as exc:  # refused (CallMismatch) or failed: what the cell reports
        other_shape = f"{type(exc).__name__}: {str(exc).split(';')[0][-120:]}"
with zoo.grad_mode():
    eager = []
    for _ in range(5):
        started = time.perf_counter()
        expected = zoo.step(model, *args)
        eager.append(time.perf_counter() - started)
print(json.dumps({"load_s": load_s, "first_s": first_s, "steady_s": statistics.median(steady),
                  "eager_s": statistics.median(eager), "max_diff": (out - expected).abs().max().item(),
                  "imported": imported, "library_imported_by_load": library_imported_by_load,
                  "other_shape": other_shape}))
"""

COMPILE_REF = r"""
import json, sys, time
import torch
from bench.zoo_models import ZOO, timed_cpp_builds
cpp = timed_cpp_builds()
zoo = ZOO[sys.argv[1]]
model, args = zoo.instantiate()
started = time.perf_counter()  # torch.compile's own imports count, as a capture's do
compiled = torch.compile(zoo.step)
with zoo.grad_mode():
    compiled(model, *args)
print(json.dumps({"compile_cold_s": time.perf_counter() - started, "cpp_builds": cpp["builds"], "cpp_build_s": cpp["s"]}))
"""

EAGER_FIRST = r"""
import json, sys, time
import torch
from bench.zoo_models import ZOO
zoo = ZOO[sys.argv[1]]
model, args = zoo.instantiate()
with zoo.grad_mode():
    started = time.perf_counter()
    zoo.step(model, *args)
print(json.dumps({"eager_first_s": time.perf_counter() - started}))
"""


def _child(code: str, *args: str, env: dict, timeout: float) -> dict:
    started = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        raised = [line for line in lines if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Refused|Failed)\b", line)]
        return {"error": (raised or lines or [f"exit {proc.returncode}"])[-1][:400], "wall_s": wall}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": wall}


def _env(scratch: Path) -> dict:
    """A fresh process with the repo importable and its own empty Inductor cache."""
    cache = scratch / "inductor"
    cache.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "TORCHINDUCTOR_CACHE_DIR": str(cache), "TRANSFORMERS_VERBOSITY": "error"}


def _pair_paths(out_dir: Path, name: str, tracer: str, backend: str) -> tuple[Path, Path]:
    return out_dir / f"{name}-{tracer}-{backend}.py", out_dir / f"{name}-{tracer}-{backend}.cache"


def _median_reference(refs: list[dict]) -> dict:
    """The torch.compile row of a model's rounds: the median cold time, every round's time; the first
    error if any failed."""
    failed = next((ref for ref in refs if "error" in ref), None)
    if failed is not None:
        return failed
    return {**refs[-1], "compile_cold_s": statistics.median(ref["compile_cold_s"] for ref in refs),
            "compile_runs_s": [ref["compile_cold_s"] for ref in refs]}


def _median_capture(results: list[dict], refs: list[dict]) -> dict:
    """A capture row of a model's rounds: the last round's (whose pair is served), with the median
    capture time, every round's, and the median of each round's capture time over the torch.compile
    run of the same round (`capture_ratio`); the first error if any failed."""
    failed = next((result for result in results if "error" in result or "refused" in result), None)
    if failed is not None:
        return failed
    row = {**results[-1], "capture_s": statistics.median(r["capture_s"] for r in results),
           "capture_runs_s": [r["capture_s"] for r in results]}
    if refs and all("error" not in ref for ref in refs):
        row["capture_ratio"] = statistics.median(r["capture_s"] / ref["compile_cold_s"] for r, ref in zip(results, refs))
    return row


def _median_run(runs: list[dict]) -> dict:
    """One serve row of `runs` (fresh processes serving the same pair): the first, with each timing
    the median over the runs, the largest difference the largest, and every run's load + first call
    (ms, sorted); the first error if any failed."""
    failed = next((run for run in runs if "error" in run), None)
    if failed is not None:
        return failed
    row = {**runs[0], "serve_runs": len(runs), "max_diff": max(run["max_diff"] for run in runs),
           "load_first_ms": sorted(1000 * (run["load_s"] + run["first_s"]) for run in runs)}
    for key in ("load_s", "first_s", "steady_s", "eager_s", "wall_s"):
        row[key] = statistics.median(run[key] for run in runs)
    return row


def run(models, tracers, backends, orders, compile_ref: bool, timeout: float, out_dir: Path, serve_runs: int = 3,
        capture_runs: int = 1) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from bench.zoo_models import ZOO

    rows = []
    for name in models:
        zoo = ZOO[name]
        missing = zoo.available()
        if missing:
            print(f"skip {name}: {missing}", file=sys.stderr)
            rows.append({"model": name, "skipped": missing})
            continue
        # Captured in rounds: torch.compile's cold run, then every capture, in turn, so that each capture
        # has a reference run next to it (C++ builds vary by a fifth between runs on a shared host).
        # The last round's pairs are the ones served.
        refs: list[dict] = []
        rounds: dict[tuple[str, str], list[dict]] = {(t, b): [] for t in tracers for b in backends}
        for _ in range(capture_runs):
            if compile_ref:
                with tempfile.TemporaryDirectory() as scratch:
                    refs.append(_child(COMPILE_REF, name, env=_env(Path(scratch)), timeout=timeout))
            for (tracer, backend), results in rounds.items():
                if results and {"error", "refused"} & set(results[-1]):
                    continue
                artifact, cache = _pair_paths(out_dir, name, tracer, backend)
                with tempfile.TemporaryDirectory() as scratch:
                    results.append(_child(CAPTURE, name, tracer, backend, str(artifact), str(cache), env=_env(Path(scratch)),
                                          timeout=timeout))
        if refs:
            eager_first = []  # eager's first call in a fresh process: what a precompiled load + first call replaces
            for _ in range(serve_runs):
                with tempfile.TemporaryDirectory() as scratch:
                    eager_first.append(_child(EAGER_FIRST, name, env=_env(Path(scratch)), timeout=timeout).get("eager_first_s"))
            firsts = [s for s in eager_first if s is not None]
            rows.append({"model": name, "tracer": "torch.compile", "backend": "inductor", **_median_reference(refs),
                         **({"eager_first_s": statistics.median(firsts)} if firsts else {})})
            print(_line(rows[-1]), file=sys.stderr)
        captured = {}
        for (tracer, backend), results in rounds.items():
            result = _median_capture(results, refs)
            captured[tracer, backend] = ({"model": name, "tracer": tracer, "backend": backend,
                                          **{("capture_wall_s" if k == "wall_s" else k): v for k, v in result.items()}},
                                         *_pair_paths(out_dir, name, tracer, backend))
            if "error" in result or "refused" in result:
                rows.append(captured[tracer, backend][0])
                print(_line(rows[-1]), file=sys.stderr)
        # Served side by side: for each backend and order, one fresh process per tracer in turn, so that
        # the host's drift over a run (page cache, background work) weighs on both tracers alike.
        for backend in backends:
            for order in orders:
                pairs = [captured[tracer, backend] for tracer in tracers
                         if not {"error", "refused"} & set(captured[tracer, backend][0])]
                runs: dict[str, list[dict]] = {row["tracer"]: [] for row, _, _ in pairs}
                for _ in range(serve_runs):
                    for row, artifact, cache in pairs:
                        with tempfile.TemporaryDirectory() as scratch:
                            runs[row["tracer"]].append(_child(SERVE, name, order, str(artifact), str(cache), row["tracer"],
                                                              env=_env(Path(scratch)), timeout=timeout))
                for row, _, _ in pairs:
                    rows.append({**row, "order": order, **_median_run(runs[row["tracer"]])})
                    print(_line(rows[-1]), file=sys.stderr)
    return rows


COLUMNS = (("model", "{}"), ("tracer", "{}"), ("backend", "{}"), ("order", "{}"), ("capture_s", "{:.1f}"),
           ("compile_cold_s", "{:.1f}"), ("load_s", "{:.3f}"), ("first_s", "{:.3f}"), ("steady_s", "{:.4f}"),
           ("eager_s", "{:.4f}"), ("max_diff", "{:.1e}"), ("imported", "{}"), ("library_imported_by_load", "{}"), ("other_shape", "{}"), ("error", "{}"),
           ("refused", "{}"))


def _cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if value is None:
        return ""
    if key == "imported":
        return ",".join(m.removeprefix("torch.") for m in value) or "-"
    if key == "library_imported_by_load":
        return "yes" if value else "-"
    return fmt.format(value)


def _line(row: dict) -> str:
    if "skipped" in row:
        return f"{row['model']}: skipped ({row['skipped']})"
    return " | ".join(_cell(row, key, fmt) for key, fmt in COLUMNS)


def _markdown(cells: list[list[str]]) -> str:
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    cells = [[key for key, _ in COLUMNS]] + [[_cell(row, key, fmt) for key, fmt in COLUMNS] for row in rows if "skipped" not in row]
    return "\n".join([_markdown(cells)] + [_line(row) for row in rows if "skipped" in row])


def passed(row: dict) -> bool:
    """Served and matching eager, or refused as the zoo documents for that model and tracer."""
    return "error" not in row and (row.get("max_diff") or 0) <= 1e-3


def summary_table(rows: list[dict]) -> str:
    """One line per model: how many cells (tracer x backend x order) served and matched eager; each
    tracer's Inductor capture time over torch.compile's cold time; load-after (load + first call) of
    each tracer, eager and Inductor backends (the median over the fresh serving processes, their range
    in brackets), and Dynamo's median over MakeFx's; the largest difference."""
    def served(model, tracer, backend, order="load-after"):
        return next((r for r in rows if (r.get("model"), r.get("tracer"), r.get("backend"), r.get("order"))
                     == (model, tracer, backend, order) and passed(r)), None)

    cells = [["model", "cells pass", "capture / torch.compile (Dynamo, MakeFx)", "load+first ms eager (Dynamo, MakeFx)",
              "load+first ms inductor (Dynamo, MakeFx)", "Dynamo / MakeFx (eager, inductor)", "eager first ms",
              "MakeFx load+first / eager first (eager, inductor)", "largest diff",
              "first shape / other shape serve (Dynamo, MakeFx)"]]
    for model in dict.fromkeys(r["model"] for r in rows if "skipped" not in r):
        mine = [r for r in rows if r.get("model") == model and r.get("tracer") != "torch.compile"]
        reference = next((r["compile_cold_s"] for r in rows if r.get("model") == model and r.get("compile_cold_s")), None)
        captures = {r["tracer"]: _capture_ratio(r, reference) for r in mine if r.get("backend") == "inductor" and "capture_s" in r}
        line = [model, f"{sum(map(passed, mine))}/{len(mine)}",
                ", ".join(f"{captures[t]:.2f}" if captures.get(t) is not None else "-" for t in ("dynamo", "makefx"))]
        ratios = []
        for backend in ("eager", "inductor"):
            pair = [served(model, tracer, backend) for tracer in ("dynamo", "makefx")]
            totals = [_load_first(r) if r else None for r in pair]
            line.append(", ".join(_spread(r) if r else "-" for r in pair))
            ratios.append(f"{totals[0] / totals[1]:.2f}" if None not in totals else "-")
        eager_first = next((r["eager_first_s"] for r in rows if r.get("model") == model and r.get("eager_first_s")), None)
        makefx = [served(model, "makefx", backend) for backend in ("eager", "inductor")]
        line += [", ".join(ratios), f"{1000 * eager_first:.0f}" if eager_first else "-",
                 ", ".join(f"{_load_first(r) / (1000 * eager_first):.2f}" if r and eager_first else "-" for r in makefx),
                 f"{max((r.get('max_diff') or 0) for r in mine):.1e}"]
        line.append(", ".join(_shapes(model, tracer, rows) for tracer in ("dynamo", "makefx")))
        cells.append(line)
    return _markdown(cells)


def _shapes(model: str, tracer: str, rows: list[dict]) -> str:
    """`first/other` for one tracer's served rows of a model: whether every one served the captured
    shape and matched eager, and whether every one served the other shape ("refused" when one refused
    it), "-" when none served."""
    served = [r for r in rows if (r.get("model"), r.get("tracer")) == (model, tracer) and "order" in r]
    if not served:
        return "-"
    first = "yes" if all(map(passed, served)) else "no"
    others = [r.get("other_shape", "") for r in served]
    other = "yes" if all(o == "ok" for o in others) else "refused" if any("Mismatch" in o for o in others) else "no"
    return f"{first}/{other}"


def _capture_ratio(row: dict, reference: float | None) -> float | None:
    """A capture's time over torch.compile's cold time: the median of the rounds' ratios (each capture
    over the reference run of its round); older rows: the capture over the reference."""
    if "capture_ratio" in row:
        return row["capture_ratio"]
    return row["capture_s"] / reference if reference else None


def _load_first(row: dict) -> float:
    """A serve row's load + first call, ms: the median over its runs (older rows: of the medians)."""
    runs = row.get("load_first_ms")
    return statistics.median(runs) if runs else 1000 * (row["load_s"] + row["first_s"])


def _spread(row: dict) -> str:
    runs = row.get("load_first_ms")
    return f"{_load_first(row):.0f} ({runs[0]:.0f}-{runs[-1]:.0f})" if runs and len(runs) > 1 else f"{_load_first(row):.0f}"


# Where a capture's time goes: its phases (precompile's own phase log) in buckets, by name prefix.
PHASE_BUCKETS = (("trace+lower", ("call ", "trace with make_fx", "lower with Inductor", "render the ATen graph")),
                 ("load rendered", ("build the kernels", "load the rendered python_code")),
                 ("freeze+seal", ("freeze the kernels", "seal the cache")),
                 ("render", ("render the Dynamo artifact",)),
                 ("write", ("write ",)))


def capture_table(rows: list[dict]) -> str:
    """One line per capture: its time beside torch.compile's cold time on the same model (medians over
    the rounds, the ratio the median of the rounds' own), and where the last round's went (seconds per
    bucket; `C++ builds` is the summed time of every compile Inductor ran, which overlap on a host with
    more than one core; `other` is what no phase covers: imports, setup)."""
    compiled = {row["model"]: row["compile_cold_s"] for row in rows if row.get("compile_cold_s") is not None}
    header = ["model", "tracer", "backend", "capture_s", "compile_cold_s", "ratio",
              *(name for name, _ in PHASE_BUCKETS), "other", "C++ builds (n, s)", "KB python_code, cache"]
    seen, lines = set(), []
    for row in rows:
        key = (row.get("model"), row.get("tracer"), row.get("backend"))
        if row.get("compile_cold_s") is not None:  # the reference, with its C++ builds
            lines.append([row["model"], row["tracer"], row["backend"], "", f"{row['compile_cold_s']:.1f}", "1.00",
                          *("" for _ in PHASE_BUCKETS), "", f"{row.get('cpp_builds', 0)}, {row.get('cpp_build_s', 0.0):.1f}", ""])
        if "capture_phases" not in row or key in seen:
            continue
        seen.add(key)
        phases = row["capture_phases"]
        buckets = [sum(v for k, v in phases.items() if k.startswith(prefixes)) for _, prefixes in PHASE_BUCKETS]
        reference = compiled.get(row["model"])
        ratio = _capture_ratio(row, reference)
        ratio = f"{ratio:.2f}" if ratio is not None else ""
        lines.append([row["model"], row["tracer"], row["backend"], f"{row['capture_s']:.1f}",
                      f"{reference:.1f}" if reference else "", ratio, *(f"{b:.2f}" for b in buckets),
                      f"{row.get('capture_runs_s', [row['capture_s']])[-1] - sum(phases.values()):.2f}",
                      f"{row.get('cpp_builds', 0)}, {row.get('cpp_build_s', 0.0):.1f}",
                      f"{row['python_code_bytes'] / 1024:.0f}, {row['cache_bytes'] / 1024:.0f}" if "cache_bytes" in row else ""])
    return _markdown([header, *lines])


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    from bench.zoo_models import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    tiny = [name for name, zoo in ZOO.items() if not zoo.real_size]
    parser.add_argument("--models", default=",".join(tiny), help="comma-separated, from: " + ", ".join(ZOO))
    parser.add_argument("--real-size", action="store_true",
                        help="the real-size models (" + ", ".join(n for n in ZOO if n not in tiny) + ") with --compile-ref")
    parser.add_argument("--tracers", default="dynamo,makefx")
    parser.add_argument("--backends", default="eager,inductor")
    parser.add_argument("--orders", default="load-first,load-after")
    parser.add_argument("--compile-ref", action="store_true", help="also time torch.compile (inductor) cold per model")
    parser.add_argument("--serve-runs", type=int, default=3,
                        help="fresh serving processes per pair and order; their timings' medians are reported")
    parser.add_argument("--capture-runs", type=int, default=1,
                        help="rounds of torch.compile's cold run and every capture, in turn; medians are reported")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    parser.add_argument("--out", type=Path, default=None, help="where the pairs go (default: a temporary dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--from-json", type=Path, default=None, help="print the tables of an earlier run's JSON; run nothing")
    options = parser.parse_args(argv)
    if options.real_size:
        options.models, options.compile_ref = ",".join(n for n in ZOO if ZOO[n].real_size), True

    def split(text: str) -> list[str]:
        return [part for part in text.split(",") if part]

    for option, known in (("models", tuple(ZOO)), ("tracers", ("dynamo", "makefx")), ("backends", ("eager", "inductor")),
                          ("orders", ("load-first", "load-after"))):
        unknown = [value for value in split(getattr(options, option)) if value not in known]
        if unknown:
            parser.error(f"unknown {option} {unknown}; choose from {list(known)}")
    if options.from_json:
        rows = json.loads(options.from_json.read_text())
    else:
        from bench.coldstart import byte_compile_precompile

        byte_compile_precompile()
        with tempfile.TemporaryDirectory() as scratch:
            out_dir = options.out or Path(scratch)
            out_dir.mkdir(parents=True, exist_ok=True)
            rows = run(split(options.models), split(options.tracers), split(options.backends), split(options.orders),
                       options.compile_ref, options.timeout, out_dir, options.serve_runs, options.capture_runs)
    print(table(rows), summary_table(rows), capture_table(rows), sep="\n\n")
    if options.json:
        options.json.write_text(json.dumps(rows, indent=1) + "\n")
    failed = [row for row in rows if "skipped" not in row and not passed(row)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
