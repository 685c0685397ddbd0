"""End-to-end on a GPU: capture a model that launches a user @triton.autotune kernel beside an
Inductor-lowered block, then load and serve it in a fresh process under no_compilation().

    python bench/gpu_e2e.py

The capture process tunes the user's kernel once before the block (so the block must tune it
again) with a TRITON_CACHE_DIR of its own (which the block must not use). The serving process
starts with empty Inductor and Triton caches; any compile or benchmark there raises. Prints one
PASS/FAIL line; exit status 0 on PASS.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent


@triton.autotune(
    configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=4)], key=["n"]
)
@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2.0, mask=mask)


@torch._dynamo.disable  # launched as-is, through Triton's own autotuner and launcher
def user_scale(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    _scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(256, 256)

    def forward(self, x):
        return (self.lin(x).relu() + 1).sin()  # Inductor lowers this to extern mm + a Triton kernel


def step(model, x):
    return user_scale(model(x))


def build():
    torch.manual_seed(0)
    return Net().cuda(), torch.randn(64, 256, device="cuda")


def reference(model, x):
    return model(x) * 2.0  # no Triton: eager ATen on the GPU


def log_cache_keys(work: Path, process: str) -> None:
    """Append each Triton compile's cache-key parts to work/keys.jsonl, named by kernel and process:
    when the serving process misses a kernel the capture bundled, the part that differs says why."""
    import json

    from triton.compiler import compiler
    from triton.runtime import cache

    original = getattr(compiler, "get_cache_key", None)
    if original is None:  # a Triton that computes its key elsewhere: nothing to log
        return

    def logged(src, backend, backend_options, env_vars):
        parts = {
            "triton": cache.triton_key()[:24], "src": src.hash(), "backend": backend.hash(),
            "options": backend_options.hash(), "env": sorted(env_vars.items()),
            "options_text": repr(backend_options),
        }
        with open(work / "keys.jsonl", "a") as out:
            out.write(json.dumps({"process": process, "kernel": getattr(src, "name", "?"), **parts}) + "\n")
        return original(src, backend, backend_options, env_vars)

    compiler.get_cache_key = logged


def capture(work: Path) -> None:
    import precompile

    log_cache_keys(work, "capture")
    model, x = build()
    with torch.no_grad():
        user_scale(model(x))  # tuned and compiled before the block, into the user's TRITON_CACHE_DIR
        with precompile.capture(step, artifact_path=work / "m.py", cache_path=work / "m.cache") as cap:
            torch.testing.assert_close(cap(model, x), reference(model, x))


def serve(work: Path) -> None:
    import precompile

    log_cache_keys(work, "serve")
    model, x = build()
    with torch.no_grad(), precompile.no_compilation():
        served = precompile.load(work / "m.py", work / "m.cache")(model, x)
        torch.testing.assert_close(served, reference(model, x))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="precompile-gpu-e2e-") as tmp:
        work = Path(tmp)
        base = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        steps = (
            ("capture", {"TRITON_CACHE_DIR": str(work / "user-triton"), "TORCHINDUCTOR_CACHE_DIR": str(work / "capture-inductor")}),
            ("serve", {"HOME": str(work / "home"), "TORCHINDUCTOR_CACHE_DIR": str(work / "serve-inductor")}),
        )
        for name, env in steps:
            child_env = {**base, **env}
            if name == "serve":
                child_env.pop("TRITON_CACHE_DIR", None)
            proc = subprocess.run(
                [sys.executable, "-c", f"from pathlib import Path; from bench.gpu_e2e import {name}; {name}(Path({str(work)!r}))"],
                env=child_env, capture_output=True, text=True, timeout=600,
            )
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                print(f"FAIL e2e-triton: the {name} process exited {proc.returncode}: {tail}")
                warned = [line for line in proc.stderr.splitlines() if "Warning:" in line][:8]
                sys.stderr.write("Warnings:\n" + ("\n".join(warned) or "(none)") + "\n\n" + proc.stderr[-4000:])
                primed = sorted(str(p.relative_to(work)) for p in work.rglob("*") if p.is_file() and "triton" in str(p))
                sys.stderr.write(f"\nTriton files under the work dir ({len(primed)}):\n" + "\n".join(primed) + "\n")
                keys = work / "keys.jsonl"
                sys.stderr.write("\nTriton cache-key parts per compile:\n" + (keys.read_text() if keys.exists() else "(none)\n"))
                return 1
        bundled = sorted(p.name for p in (work / "serve-inductor").rglob("*.autotune.json"))
        print(f"PASS e2e-triton: captured, then served under no_compilation() in a fresh process (autotune results primed: {bundled})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
