"""`precompile demo`: capture the built-in model, reload the pair in a fresh process, compare."""
from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from precompile.capturing.progress import phase
from precompile.cli import child_python
from precompile.errors import PrecompileError

TOLERANCE = 1e-4
"""The largest |served - eager| the demo accepts as a match."""
SERVED_KEYS = {"load_s", "first_call_s", "max_abs_diff", "cache_used", "inductor_imported"}
"""What the fresh process's report must hold (precompile.examples.serve_demo prints it)."""


@dataclass
class DemoReport:
    directory: Path
    steps: list[tuple[str, float]] = field(default_factory=list)
    artifact_path: Path | None = None
    cache_path: Path | None = None
    served: dict | None = None

    @property
    def ok(self) -> bool:
        return self.served is not None and self.served["max_abs_diff"] <= TOLERANCE

    def to_json(self) -> str:
        """What `precompile demo --json` prints: the steps with their seconds, the pair's paths, the fresh
        process's report (load and first-call seconds, max |served - eager|, cache used, inductor imported), ok."""
        return json.dumps({
            "directory": str(self.directory),
            "steps": [{"step": step, "seconds": seconds} for step, seconds in self.steps],
            "artifact_path": None if self.artifact_path is None else str(self.artifact_path),
            "cache_path": None if self.cache_path is None else str(self.cache_path),
            "served": self.served,
            "tolerance": TOLERANCE,
            "ok": self.ok,
        }, indent=2) + "\n"


def run_demo(directory: Path, backend: str) -> DemoReport:
    report = DemoReport(directory=directory)
    started = time.perf_counter()
    with phase("import torch and precompile"):
        import torch

        import precompile
        from precompile.examples.transformer import make_demo, run

    report.steps.append(("import torch and precompile", time.perf_counter() - started))
    model, x = make_demo()
    directory.mkdir(parents=True, exist_ok=True)
    report.artifact_path = directory / "transformer.py"
    report.cache_path = directory / "transformer.cache"

    started = time.perf_counter()
    with torch.no_grad(), precompile.capture(
        run,
        artifact_path=report.artifact_path,
        cache_path=report.cache_path,
        tracer=precompile.MakeFxTracer(),
        backend=backend,
    ) as cap:
        cap(model, x)
    report.steps.append((f"capture (trace, lower with backend={backend!r}, write)", time.perf_counter() - started))

    started = time.perf_counter()
    serve = child_python.command("-m", "precompile.examples.serve_demo", str(report.artifact_path.resolve()), str(report.cache_path.resolve()))
    with tempfile.TemporaryDirectory(prefix="precompile-demo-kernels-") as empty_cache, child_python.empty_directory() as cwd, \
            phase("serve the pair in a fresh process under no_compilation()"):
        # An empty Inductor cache dir: the fresh process has only the pair to go on.
        child = subprocess.run(
            serve,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            env=child_python.environment({"TORCHINDUCTOR_CACHE_DIR": empty_cache}),
        )
    report.steps.append(("fresh process: import, load and first call under no_compilation(), compare", time.perf_counter() - started))
    rerun = f"run `{shlex.join(serve)}` to see its whole output"
    if child.returncode != 0:
        lines = child.stderr.strip().splitlines()
        raise PrecompileError(
            f"the fresh process serving ({report.artifact_path}, {report.cache_path}) failed with exit code "
            f"{child.returncode}: {lines[-1] if lines else 'no error output'}; {rerun}"
        )
    report.served = _served_report(child.stdout)
    if report.served is None:
        raise PrecompileError(
            f"the fresh process serving ({report.artifact_path}, {report.cache_path}) exited 0 but printed no report; {rerun}"
        )
    return report


def _served_report(stdout: str) -> dict | None:
    """The fresh process's JSON report (its last line), or None if it printed none."""
    lines = stdout.strip().splitlines()
    try:
        served = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return served if isinstance(served, dict) and SERVED_KEYS <= served.keys() else None
