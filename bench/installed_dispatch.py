"""Per-call cost of an installed DynamoTracer artifact against torch.compile, side by side in one run.

The model's child module graph-breaks inside its forward (a print-free `torch._dynamo.graph_break()`),
so the capture is served installed: its variants sit on the live code objects and calls run under
Dynamo's frame evaluator. An installed artifact refuses to share a frame with a live compile, so the
two sides run two copies of the same model module, written into a temporary dir by this script.

`--model llama` serves a tiny transformers Llama whose MLP graph-breaks (13 variants, over 250 checks
by name: the pins that hold what the guards read through modules, classes and functions). Its code
objects are transformers' own, which one process cannot both serve and compile, so each side runs in
processes of its own, alternating, and each is divided by eager timed in the same process.

    python bench/installed_dispatch.py [--backend inductor|eager] [--model toy|llama]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

MODEL = '''
import torch

class Child(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)

    def forward(self, x):
        y = self.linear(x)
        torch._dynamo.graph_break()
        return torch.relu(y) * 2

class Parent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Linear(64, 64)
        self.child = Child()

    def forward(self, x):
        return self.child(self.pre(x).sin()) + 1

def step(model, x):
    return model(x)

def make():
    torch.manual_seed(0)
    return Parent()
'''

SHAPES = "[torch.ones(4, 64), torch.ones(16, 64)]"

CAPTURE = f"""
import sys, torch, precompile
sys.path.insert(0, sys.argv[1])
import served_model
model = served_model.make()
with torch.no_grad(), precompile.capture(served_model.step, artifact_path=sys.argv[1] + "/i.py",
                                         cache_path=sys.argv[1] + "/i.cache", backend=sys.argv[2]) as cap:
    for x in {SHAPES}:
        cap(model, x)
"""

MEASURE = f"""
import json, statistics, sys, time, torch, precompile
sys.path.insert(0, sys.argv[1])
import compiled_model, served_model
torch.set_num_threads(1)  # the machine is shared: keep OpenMP spinning out of the per-call figures
served = precompile.load(sys.argv[1] + "/i.py", sys.argv[1] + "/i.cache")
assert served.installed
compiled = torch.compile(compiled_model.step, backend=sys.argv[2])
served_net, compiled_net = served_model.make(), compiled_model.make()
results = {{}}
with torch.no_grad():
    for x in {SHAPES}:
        assert torch.allclose(served(served_net, x), compiled(compiled_net, x), atol=1e-5)
    for x in {SHAPES}:
        samples = {{"torch.compile": [], "precompile": []}}
        for _ in range(15):
            for name, fn, net in (("torch.compile", compiled, compiled_net), ("precompile", served, served_net)):
                t = time.perf_counter()
                for _ in range(200):
                    fn(net, x)
                samples[name].append((time.perf_counter() - t) / 200)
        results[f"x{{tuple(x.shape)}}"] = {{k: statistics.median(v) for k, v in samples.items()}}
print(json.dumps(results))
"""

LLAMA = '''
import torch
from transformers import LlamaConfig, LlamaForCausalLM

class BreakingMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        out = self.mlp(x)
        torch._dynamo.graph_break()
        return out

def step(model, ids):
    return model(input_ids=ids, use_cache=False).logits

def make():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(config).eval()
    model.model.layers[0].mlp = BreakingMLP(model.model.layers[0].mlp)
    return model
'''

LLAMA_SHAPES = "[torch.arange(8).reshape(1, 8), torch.arange(16).reshape(2, 8) % 64]"

LLAMA_CAPTURE = CAPTURE.replace(SHAPES, LLAMA_SHAPES)

LLAMA_MEASURE = f"""
import json, statistics, sys, time, torch, precompile
sys.path.insert(0, sys.argv[1])
import served_model
torch.set_num_threads(1)
net = served_model.make()
if sys.argv[3] == "precompile":
    side = precompile.load(sys.argv[1] + "/i.py", sys.argv[1] + "/i.cache")
    assert side.installed
else:
    side = torch.compile(served_model.step, backend=sys.argv[2])
results = {{}}
with torch.no_grad():
    for ids in {LLAMA_SHAPES}:
        assert torch.allclose(side(net, ids), served_model.step(net, ids), atol=1e-5)
    for ids in {LLAMA_SHAPES}:
        samples = {{"eager": [], "side": []}}
        for _ in range(15):
            for name, fn in (("eager", served_model.step), ("side", side)):
                t = time.perf_counter()
                for _ in range(50):
                    fn(net, ids)
                samples[name].append((time.perf_counter() - t) / 50)
        results[f"ids{{tuple(ids.shape)}}"] = {{k: statistics.median(v) for k, v in samples.items()}}
print(json.dumps(results))
"""


def _llama(work: str, backend: str) -> None:
    """Each side in processes of its own, three rounds alternating; each figure relative to eager in the
    same process, so the host's drift between processes cancels."""
    import statistics

    (Path(work) / "served_model.py").write_text(LLAMA)
    subprocess.run([sys.executable, "-c", LLAMA_CAPTURE, work, backend], check=True, capture_output=True)
    rounds: dict[str, list[dict]] = {"torch.compile": [], "precompile": []}
    for _ in range(3):
        for side in rounds:
            proc = subprocess.run([sys.executable, "-c", LLAMA_MEASURE, work, backend, side],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(proc.stderr[-3000:])
            rounds[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"backend={backend}, installed artifact of a tiny transformers Llama (MLP graph-breaks)")
    print(f"{'call':<14}{'eager us':>10}{'torch.compile us':>18}{'precompile us':>16}{'ratio':>8}")
    worst = 0.0
    for shape in rounds["precompile"][0]:
        rel = {side: statistics.median(r[shape]["side"] / r[shape]["eager"] for r in rows)
               for side, rows in rounds.items()}
        eager = statistics.median(r[shape]["eager"] for rows in rounds.values() for r in rows)
        ratio = rel["precompile"] / rel["torch.compile"]
        worst = max(worst, ratio)
        print(f"{shape:<14}{eager * 1e6:>10.1f}{rel['torch.compile'] * eager * 1e6:>18.1f}"
              f"{rel['precompile'] * eager * 1e6:>16.1f}{ratio:>8.2f}")
    print(f"-- target: installed per call <= 1.1x torch.compile; worst ratio {worst:.2f}")


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("inductor", "eager"), default="inductor")
    parser.add_argument("--model", choices=("toy", "llama"), default="toy")
    args = parser.parse_args()
    backend = args.backend
    with tempfile.TemporaryDirectory(prefix="precompile-installed-") as work:
        if args.model == "llama":
            return _llama(work, backend)
        for name in ("served_model", "compiled_model"):
            (Path(work) / f"{name}.py").write_text(MODEL)
        subprocess.run([sys.executable, "-c", CAPTURE, work, backend], check=True, capture_output=True)
        proc = subprocess.run([sys.executable, "-c", MEASURE, work, backend], capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stderr[-3000:])
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"backend={backend}, installed artifact")
    print(f"{'call':<14}{'torch.compile us':>18}{'precompile us':>16}{'ratio':>8}")
    for name, row in results.items():
        ratio = row["precompile"] / row["torch.compile"]
        print(f"{name:<14}{row['torch.compile'] * 1e6:>18.1f}{row['precompile'] * 1e6:>16.1f}{ratio:>8.2f}")
    worst = max(row["precompile"] / row["torch.compile"] for row in results.values())
    print(f"-- target: installed per call <= 1.1x torch.compile; worst ratio {worst:.2f}")


if __name__ == "__main__":
    main()
