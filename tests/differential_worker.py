"""The serving side of the differential suite, in a process that never captured anything: for each
job (a program's pairs and the changes to make), build the model twice, make the change to both
sides, call fn eagerly and the loaded artifact, and report how each case came out.

Run as `python -c "import differential_worker; differential_worker.main()"`; one JSON job a line on
stdin, one JSON reply a line on stdout.
"""
from __future__ import annotations

import copy
import importlib
import json
import sys
import traceback

import differential_programs as programs
import torch

import precompile

_snapshots: dict[str, dict] = {}


def _module(directory: str, name: str):
    if directory not in sys.path:
        sys.path.insert(0, directory)
    module = importlib.import_module(name)
    if name not in _snapshots:  # the globals as imported, to set back before every case
        _snapshots[name] = {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                            for k, v in vars(module).items() if k.startswith("G_")}
    for key, value in _snapshots[name].items():
        if isinstance(value, torch.Tensor):
            getattr(module, key).copy_(value)
        else:
            setattr(module, key, value)
    return module


_runnables: dict[tuple[str, str], object] = {}


def _loaded(artifact: str, cache: str):
    """Each pair loaded once, as a server does, and called for every case after."""
    if (artifact, cache) not in _runnables:
        _runnables[artifact, cache] = precompile.load(artifact, cache)
    return _runnables[artifact, cache]


def _outcome(run):
    try:
        return "ok", run()
    except precompile.CallMismatch as exc:
        return "refused", str(exc)
    except Exception as exc:  # what eager raises is compared with what serving raises
        return "raised", f"{type(exc).__name__}: {exc}"


def _compare(eager, served, model_e, model_s, autograd: bool) -> str | None:
    """None when served is what eager returned (values, dtype, shape, whether it carries autograd) and
    left the models in the same state; else what differs."""
    if served.dtype != eager.dtype or served.shape != eager.shape:
        return f"served {served.dtype} {tuple(served.shape)}, eager {eager.dtype} {tuple(eager.shape)}"
    if not torch.allclose(served.detach().double(), eager.detach().double(), atol=1e-4, rtol=1e-3):
        return f"values differ by {(served.detach().double() - eager.detach().double()).abs().max().item():.3g}"
    if autograd and served.requires_grad != eager.requires_grad:
        return f"served requires_grad={served.requires_grad}, eager {eager.requires_grad}"
    for (name, a), (_, b) in zip(model_e.state_dict().items(), model_s.state_dict().items()):
        if not torch.allclose(a.double(), b.double(), atol=1e-4):
            return f"model state {name} differs after the call"
    return None


def case(job: dict, tracer: str, change: dict) -> dict:
    spec = job["spec"]
    module = _module(job["dir"], job["module"])
    torch.set_default_dtype(torch.float64 if change["what"] == "default_dtype" else torch.float32)
    undo = None
    try:
        programs.apply_to_module(change, module)
        undo = programs.apply_to_torch(change)
        grad = change["value"] if change["what"] == "grad" else spec["grad"]
        model_e, model_s = module.build(), module.build()
        for model in (model_e, model_s):
            programs.apply_to_model(change, model)
        closure = "closure" in spec["features"]
        k = spec["values"].get("closure")
        fn = module.make_closure(change["value"] if change["what"] == "closure" else k) if closure else module.step
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
        try:
            served_fn = _loaded(*job["pairs"][tracer])
        except precompile.PrecompileError as exc:  # what the artifact compares with is patched away: refused at load
            return {"outcome": "refused", "detail": str(exc)}
        with torch.set_grad_enabled(grad):
            eager = _outcome(lambda: fn(model_e, x.clone()))
            served = _outcome(lambda: served_fn(model_s, x.clone()))
    finally:
        torch.set_default_dtype(torch.float32)
        if undo is not None:
            undo()
    if served[0] == "refused":
        return {"outcome": "refused", "detail": served[1]}
    if served[0] == "raised" or eager[0] == "raised":
        same = served[0] == eager[0] and served[1].split(":")[0] == eager[1].split(":")[0]
        return {"outcome": "both raised" if same else "DIFFERENT", "detail": f"eager {eager}, served {served}"}
    difference = _compare(eager[1], served[1], model_e, model_s, autograd=True)
    return {"outcome": "same" if difference is None else "DIFFERENT", "detail": difference or ""}


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        replies = []
        for tracer in sorted(job["pairs"]):
            for index, change in enumerate(job["changes"]):
                try:
                    replies.append({"tracer": tracer, "change": index, **case(job, tracer, change)})
                except Exception:
                    replies.append({"tracer": tracer, "change": index, "outcome": "ERROR", "detail": traceback.format_exc()})
        print(json.dumps(replies), flush=True)
