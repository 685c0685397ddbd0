"""The rank check of the GPU check: capture a step that all-reduces over NCCL under torchrun, then
serve it on every rank with load_everywhere under no_compilation(), equal to eager.

    python bench/gpu_ranks.py [--backend nccl|gloo]

nccl (the default) runs one rank per GPU, at most 2: NCCL refuses two ranks on one GPU, so a
one-GPU machine checks a world of size 1 (the collective still lowers to NCCL through Inductor and
Triton, and the pair still travels through load_everywhere's broadcast). gloo runs 2 ranks on the
CPU, the same script end to end on a machine without a GPU. Prints one PASS or FAIL line; exits 1 on
FAIL. Every launch is bounded, and a hung one is terminated with its ranks.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

LAUNCH_TIMEOUT_S = 300


def _rank(phase: str, directory: str, backend: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    import precompile

    rank = int(os.environ["RANK"])
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=120))

    def step(model, x):
        return funcol.all_reduce(model(x).relu(), "sum", dist.group.WORLD)

    torch.manual_seed(0)
    model, x = torch.nn.Linear(64, 64).to(device), torch.randn(8, 64, device=device) + rank
    artifact, cache = f"{directory}/step.py", f"{directory}/step.cache"
    with torch.no_grad():
        if phase == "capture":
            with precompile.capture(step, artifact_path=artifact, cache_path=cache, tracer=precompile.MakeFxTracer(),
                                    backend="inductor") as cap:
                cap(model, x)
            result = {"rank": rank}
        else:
            served = precompile.distributed.load_everywhere(artifact, cache)
            with precompile.no_compilation():
                got = served(model, x)
            result = {"rank": rank, "equal": torch.allclose(got, step(model, x)), "cache_used": served.cache_used}
    dist.destroy_process_group()
    print(json.dumps(result), flush=True)


def _launch(ranks: int, phase: str, directory: Path, backend: str) -> list[dict]:
    """torchrun on 127.0.0.1 with `ranks` ranks; each rank's JSON line. Raises RuntimeError on a failure or hang."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = directory / f"{phase}.log"
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--master-addr=127.0.0.1",
               f"--master-port={port}", __file__, "--rank", phase, str(directory), "--backend", backend]
    with open(log, "w") as out:  # a file, not a pipe: a rank that outlives torchrun cannot block the read
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun stops its ranks on SIGTERM
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise RuntimeError(f"{phase} on {ranks} ranks hung past {LAUNCH_TIMEOUT_S} s (log: {log})") from None
    text = log.read_text()
    if proc.returncode != 0:
        raise RuntimeError(f"{phase} on {ranks} ranks exited {proc.returncode}: {text[-1500:]}")
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"rank"')]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    backend = parser.parse_args().backend
    name = f"ranks-{backend}"
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available():
            print(f"FAIL {name}: no CUDA device")
            return 1
        ranks = min(2, torch.cuda.device_count())
    else:
        ranks = 2
    with tempfile.TemporaryDirectory(prefix="precompile-gpu-ranks-") as directory:
        try:
            _launch(ranks, "capture", Path(directory), backend)
            served = _launch(ranks, "serve", Path(directory), backend)
        except RuntimeError as exc:
            print(f"FAIL {name}: {exc}")
            return 1
    if len(served) != ranks or not all(r["equal"] and r["cache_used"] for r in served):
        print(f"FAIL {name}: served results {served}")
        return 1
    print(f"PASS {name}: {ranks} rank(s), captured (MakeFx, inductor) and served equal to eager under no_compilation()")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank"]:
        _rank(sys.argv[2], sys.argv[3], sys.argv[5])
    else:
        sys.exit(main())
