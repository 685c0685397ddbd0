"""Every text torch execs from an AOTAutograd entry's graph module is shown, or is a finding (issue 52, finding 2).

An AOTAutograd entry keeps each saved graph as a `SerializedGraphModule` (fn, args): at load torch
calls `reduce_graph_module(body, import_block)`, which execs `import_block + body["_code"]`
(torch/fx/graph_module.py). show recognises a graph's code by a string that starts `def forward(self`,
so the `import_block` (always exec'd, first) was never shown, and a `_code` that begins with anything
else (`import os; ...` then the forward) was not recognised at all: `extract` wrote no code file
holding the text, while unpickling the entry with torch and deserializing it (what a cache hit does)
runs it.
"""
from __future__ import annotations

import base64
import zlib

import pytest
from test_inspect_helpers import ROOT, run_cli

PAYLOAD = "import os\nos.system('touch /tmp/pwned')\n"
FORWARD = "\n\n\ndef forward(self, x):\n    return (x,)\n    "


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _text(value: str) -> bytes:
    return b"\x8c" + bytes([len(value)]) + value.encode()  # SHORT_BINUNICODE


def _global(module: str, name: str) -> bytes:
    return _text(module) + _text(name) + b"\x93"  # STACK_GLOBAL


def _serialized_graph_module(code: str, import_block: str) -> bytes:
    """SerializedGraphModule as torch pickles it: cls.__new__(cls), then BUILD {fn: reduce_graph_module, args: (body, import_block)}."""
    return (b"\x80\x04" + _global("torch._functorch._aot_autograd.aot_autograd_result", "SerializedGraphModule") + b")\x81"
            + b"}(" + _text("fn") + _global("torch.fx.graph_module", "reduce_graph_module")
            + _text("args") + b"}" + _text("_code") + _text(code) + b"s" + _text(import_block) + b"\x86u" + b"b.")


def _mega_cache(kind: str, content: bytes) -> bytes:
    def raw(data: bytes) -> bytes:
        return len(data).to_bytes(8, "big") + data

    body = (1).to_bytes(8, "big") + raw(base64.b64encode(kind.encode())) + (1).to_bytes(8, "big")
    body += raw(base64.b64encode(b"k")) + raw(content)
    return zlib.crc32(body).to_bytes(4, "big") + body


@pytest.mark.parametrize(("code", "import_block"), [(FORWARD, PAYLOAD), (PAYLOAD + FORWARD, "")],
                         ids=["in-import-block", "before-forward"])
def test_graph_code_torch_execs_is_listed_and_extracted_as_code(capsys, tmp_path, code, import_block):
    """Found by where the pickle puts it (the `_code` value, the import block closing the args), not
    by what the text says: show counts it, extract writes it as code load runs."""
    path = tmp_path / "mc.bin"
    path.write_bytes(_mega_cache("aot_autograd", _serialized_graph_module(code, import_block)))
    rc, out, err = run_cli(capsys, ["show", str(path)])
    assert rc == 0, err
    assert f"0 output modules, {2 if import_block else 1} graph modules" in out, out
    rc, out, err = run_cli(capsys, ["extract", str(path), str(tmp_path / "out")])
    assert rc == 0, err
    written = {file.name: file.read_text() for file in (tmp_path / "out" / "mega_cache" / "code").iterdir()}
    assert any("os.system('touch /tmp/pwned')" in text for text in written.values()), written
    assert ("import block of aot_autograd k (graph; load runs it)" in out) == bool(import_block), out
