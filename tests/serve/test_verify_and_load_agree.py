"""verify and load agree on every artifact: none is hostile to one and served by the other. Every pair
under fixtures/ and captures of both tracers and both serving modes (a transformers model with a graph
break inside a layer among them) go through `precompile verify` here and `precompile.load` in a
fresh process whose cwd would receive the hostile payloads' marker.

"Hostile" is a failed verify check on what load runs or unpickles: the opaque state (its pickle and
its spelling) and the bytecode the cache carries in python_code's place."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_fresh

import installed_cases as ic
import precompile
from gate_model import Scaled, step
from test_inspect_helpers import run_cli

LOAD_RUNS = {"opaque pickle", "opaque state", "python_code bytecode", "python_code typed metadata"}
MARKER = "PRECOMPILE_POISON_MARKER"
FIXTURE_PAIRS = sorted(str(py.with_suffix("")) for py in (ROOT / "fixtures").glob("*/*.py") if py.with_suffix(".cache").exists())

LOAD_EACH = r"""
import json, os, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, os.path.join(sys.argv[1], "fixtures"))
import precompile
outcomes = {}
for prefix in sys.argv[2:]:
    if os.path.exists("PRECOMPILE_POISON_MARKER"):
        os.remove("PRECOMPILE_POISON_MARKER")
    try:
        precompile.load(prefix + ".py", prefix + ".cache").unload()
        outcome = {"loaded": True}
    except Exception as exc:
        outcome = {"loaded": False, "error": f"{type(exc).__name__}: {exc}"}
    outcome["payload_ran"] = os.path.exists("PRECOMPILE_POISON_MARKER")
    outcomes[prefix] = outcome
print(json.dumps(outcomes))
"""


def _capture(prefix: Path, fn, args, tracer) -> str:
    with precompile.capture(fn, artifact_path=f"{prefix}.py", cache_path=f"{prefix}.cache", tracer=tracer,
                            backend="eager", verbose=False) as cap:
        cap(*args)
    return str(prefix)


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> list[str]:
    """One pair each: MakeFx, Dynamo standalone, Dynamo installed, and a transformers Llama installed."""
    directory = tmp_path_factory.mktemp("agree")
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    pairs = [_capture(directory / "makefx", step, (Scaled(), x), precompile.MakeFxTracer()),
             _capture(directory / "dynamo", step, (Scaled(), x), precompile.DynamoTracer()),
             _capture(directory / "installed", ic.run, (ic.make("print"), torch.ones(4, 8)), precompile.DynamoTracer())]
    pytest.importorskip("transformers")
    with torch.no_grad():
        pairs.append(_capture(directory / "llama", ic.llama_logits, (ic.tiny_llama(), torch.arange(6).reshape(1, 6) % 64),
                              precompile.DynamoTracer()))
    return pairs


def _load_outcomes(prefixes: list[str], cwd: Path) -> dict[str, dict]:
    """load of each pair in one fresh process; a pair refused for a name another pair already bound
    there (two standalone Dynamo fixtures of one module) is loaded again in a process of its own."""
    def run(chunk: list[str]) -> dict[str, dict]:
        proc = run_fresh(LOAD_EACH, str(ROOT), *chunk, cwd=cwd)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    outcomes = run(prefixes)
    for prefix, outcome in outcomes.items():
        if "already binds" in outcome.get("error", ""):
            outcomes[prefix] = run([prefix])[prefix]
    return outcomes


def test_no_artifact_is_hostile_to_verify_and_served_by_load(captured, capsys, tmp_path):
    prefixes = FIXTURE_PAIRS + captured
    outcomes = _load_outcomes(prefixes, tmp_path)
    hostile_count = 0
    for prefix in prefixes:
        rc, out, _ = run_cli(capsys, ["verify", "--json", prefix])
        checks = json.loads(out).get("checks", [])
        hostile = sorted({c["name"] for c in checks if c["status"] == "fail" and c["name"] in LOAD_RUNS})
        outcome = outcomes[prefix]
        hostile_count += bool(hostile)
        assert not (hostile and outcome["loaded"]), (prefix, hostile, outcome)
        refused_as_hostile = "`precompile verify` names every such problem" in outcome.get("error", "")
        assert not (refused_as_hostile and not hostile), (prefix, outcome, checks)
        if not prefix.endswith("damaged/poisoned"):  # its python_code writes the marker itself: trusted, executable input
            assert not outcome["payload_ran"], (prefix, outcome)
    for prefix in captured:  # our own artifacts: verified and served
        assert outcomes[prefix]["loaded"], (prefix, outcomes[prefix])
        assert run_cli(capsys, ["verify", prefix])[0] == 0, prefix
    assert hostile_count >= 5  # fixtures/hostile/dynamo_*: each refused by both
