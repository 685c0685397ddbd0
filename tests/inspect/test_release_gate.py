"""`precompile diff --fail-on` as the gate between two releases: every change to what a call serves is
in the category docs/inspect.md names, for both tracers, and an unchanged recapture passes them all.
The resealed caches are built here as anyone who can edit a cache would build them."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import msgspec
import pytest
import torch

import precompile
from gate_model import Scaled, step
from precompile.artifact import codec
from precompile.inspect.diff.diff import CATEGORIES
from test_inspect_helpers import FIXTURES, ROOT, run_cli

RELEASES = {  # name: (grad enabled, scale, hidden, dtype)
    "base": (True, 1.0, 32, torch.float32),
    "again": (True, 1.0, 32, torch.float32),
    "no_grad": (False, 1.0, 32, torch.float32),
    "scale": (True, 0.5, 32, torch.float32),
    "hidden": (True, 1.0, 64, torch.float32),
    "float64": (True, 1.0, 32, torch.float64),
}
TRACERS = {"dynamo": precompile.DynamoTracer, "makefx": precompile.MakeFxTracer}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[tuple[str, str], str]:
    """Each release of gate_model captured by each tracer (eager backend): {(tracer, release): prefix}."""
    directory = tmp_path_factory.mktemp("releases")
    out = {}
    for tracer, make in TRACERS.items():
        for name, (grad, scale, hidden, dtype) in RELEASES.items():
            torch.manual_seed(0)
            model = Scaled(hidden, dtype)
            model.scale = scale
            prefix = directory / f"{tracer}-{name}"
            with torch.set_grad_enabled(grad), precompile.capture(
                step, artifact_path=f"{prefix}.py", cache_path=f"{prefix}.cache", tracer=make(), backend="eager", verbose=False
            ) as cap:
                cap(model, torch.randn(4, 8, dtype=dtype))
            out[tracer, name] = str(prefix)
    return out


def _diff(capsys, a: str, b: str, *flags: str) -> tuple[int, dict]:
    rc, out, _ = run_cli(capsys, ["diff", "--json", *flags, a, b])
    return rc, json.loads(out)


@pytest.mark.parametrize("tracer", TRACERS)
def test_an_unchanged_recapture_passes_a_gate_naming_every_category(releases, capsys, tracer):
    rc, report = _diff(capsys, releases[tracer, "base"], releases[tracer, "again"], "--fail-on", ",".join(CATEGORIES))
    assert rc == 0 and report["equal"], report["entries"]


@pytest.mark.parametrize("tracer", TRACERS)
def test_grad_mode_and_a_model_attribute_are_guards_named_with_both_values(releases, capsys, tracer):
    base = releases[tracer, "base"]
    rc, report = _diff(capsys, base, releases[tracer, "no_grad"], "--fail-on", "guards")
    grad = [e for e in report["entries"] if e["section"] == "guards" and "grad_mode" in e["key"]]
    if tracer == "makefx":  # a MakeFx forward serves every grad mode alike: no guard, no false alarm
        assert rc == 0 and report["equal"] and not grad, report["entries"]
    else:
        assert rc == 1 and report["categories"].get("guards")
        assert len(grad) == 1 and grad[0]["a"].lower().endswith("true") and grad[0]["b"].lower().endswith("false")
    rc, report = _diff(capsys, base, releases[tracer, "scale"], "--fail-on", "guards")
    scale = [e for e in report["entries"] if e["section"] == "guards" and e["key"].endswith("scale")]
    assert rc == 1 and len(scale) == 1 and "1.0" in scale[0]["a"] and "0.5" in scale[0]["b"], report["entries"]


@pytest.mark.parametrize("tracer", TRACERS)
def test_parameter_shapes_and_dtypes_are_params_whichever_tracer_captured(releases, capsys, tracer):
    base = releases[tracer, "base"]
    rc, report = _diff(capsys, base, releases[tracer, "hidden"], "--fail-on", "params")
    params = {e["key"]: e for e in report["entries"] if e["section"] in ("params", "buffers")}
    assert rc == 1 and set(params) == {"fc.weight", "fc.bias", "shift"}, report["entries"]
    assert "(32, 8)" in params["fc.weight"]["a"] and "(64, 8)" in params["fc.weight"]["b"]
    rc, report = _diff(capsys, base, releases[tracer, "float64"], "--fail-on", "params")
    assert rc == 1 and all("float64" in e["b"] for e in report["entries"] if e["section"] in ("params", "buffers"))
    assert run_cli(capsys, ["diff", "--fail-on", "calling-convention", base, releases[tracer, "float64"]])[0] == 1
    assert report["categories"].get("guards") is None, report["entries"]  # tensor metadata is not also a guard


def _sections(cache: Path) -> tuple[codec.CacheEnvelope, dict[str, bytes]]:
    data = cache.read_bytes()
    envelope, end = codec.decode_header(data)
    return envelope, codec.decode_payload(envelope.bundle, data, end) if envelope.bundle else {}


def _resealed(source: str, tmp_path: Path, files: dict[str, bytes] | None = None, kernels: dict | None = None,
              **fields) -> str:
    """A copy of the pair `source` whose cache is rebuilt around other bundle bytes, kernel map or
    header fields, every hash and the header seal recomputed, as an editor of the cache can."""
    prefix = tmp_path / Path(source).name
    shutil.copy(f"{source}.py", f"{prefix}.py")
    envelope, payload = _sections(Path(f"{source}.cache"))
    if files is not None or kernels is not None:
        kinds = {f.path: f.kind for f in envelope.bundle.files}
        bundle, compressed = codec.build_bundle({p: (kinds[p], data) for p, data in (files or payload).items()},
                                                envelope.bundle.keys, kernels if kernels is not None else envelope.bundle.kernels,
                                                envelope.bundle.provenance)
        envelope = msgspec.structs.replace(envelope, bundle=bundle)
    else:
        compressed = Path(f"{source}.cache").read_bytes()[-envelope.bundle.payload_compressed_size:] if envelope.bundle else b""
    envelope = msgspec.structs.replace(envelope, **fields)
    Path(f"{prefix}.cache").write_bytes(codec.encode_cache(envelope, compressed))
    return str(prefix)


def test_a_library_replaced_by_another_librarys_bytes_is_a_kernels_change(tmp_path, capsys):
    source = str(FIXTURES / "v1/dynamo_lowered")
    envelope, files = _sections(Path(f"{source}.cache"))
    first, second = sorted(set(envelope.bundle.kernels.values()))[:2]
    forged = _resealed(source, tmp_path, files={**files, first: files[second]})
    assert run_cli(capsys, ["verify", forged])[0] == 0  # sealed: only what it runs tells them apart
    rc, report = _diff(capsys, source, forged, "--fail-on", "kernels")
    assert rc == 1 and [e["key"] for e in report["entries"]] == [
        next(e for e in report["entries"] if e["key"].startswith("kernel built from"))["key"]]
    assert report["entries"][0]["a"] != report["entries"][0]["b"]


def test_two_swapped_kernel_map_entries_are_each_a_kernels_change(tmp_path, capsys):
    source = str(FIXTURES / "v1/dynamo_lowered")
    envelope, _ = _sections(Path(f"{source}.cache"))
    (one, lib_one), (two, lib_two) = sorted(envelope.bundle.kernels.items())[:2]
    assert lib_one != lib_two
    forged = _resealed(source, tmp_path, kernels={**envelope.bundle.kernels, one: lib_two, two: lib_one})
    for flags in ((), ("--provenance",)):
        rc, report = _diff(capsys, source, forged, "--fail-on", "kernels", *flags)
        changed = sorted(e["key"] for e in report["entries"] if e["section"] == "bundle")
        assert rc == 1 and changed == [f"kernel map: source sha256 {one}", f"kernel map: source sha256 {two}"], report["entries"]


def test_a_cache_resealed_around_other_bytecode_or_metadata_is_a_code_change(captured, tmp_path, capsys):
    """python_code byte-identical, the cache's bytecode (or typed metadata) another python_code's:
    load would run it, so diff names it in `code` and points at verify."""
    source = str(captured["mlp_batchnorm"][0])[: -len(".py")]
    envelope, _ = _sections(Path(f"{source}.cache"))
    other, _ = _sections(Path(str(captured["plain_function"][1])))
    for field in ("python_bytecode", "metadata_msgpack"):
        (tmp_path / field).mkdir()
        forged = _resealed(source, tmp_path / field,
                           **{field: msgspec.structs.replace(getattr(other, field), code_hash=envelope.code_hash)})
        rc, report = _diff(capsys, source, forged, "--fail-on", "code")
        changed = [e for e in report["entries"] if e["key"].startswith("python_code ")]
        assert rc == 1 and len(changed) == 1 and changed[0]["a"] == "agrees with python_code", report["entries"]
        assert "DIFFERS from python_code" in changed[0]["b"] and "precompile verify" in changed[0]["b"]
        assert report["categories"] == {"code": 1}
        assert hashlib.sha256(Path(f"{forged}.py").read_bytes()).digest() == hashlib.sha256(Path(f"{source}.py").read_bytes()).digest()


@pytest.fixture(scope="module")
def graph_releases(tmp_path_factory) -> dict[tuple[str, str], str]:
    """gate_model releases whose forward differs in the captured graph only, by each tracer."""
    from gate_model import activated

    directory = tmp_path_factory.mktemp("graph-releases")
    out = {}
    for tracer, make in TRACERS.items():
        for kind in ("relu", "silu", "eps5", "eps6"):
            torch.manual_seed(0)
            model = activated(kind)()
            prefix = directory / f"{tracer}-{kind}"
            with precompile.capture(step, artifact_path=f"{prefix}.py", cache_path=f"{prefix}.cache", tracer=make(),
                                    backend="eager", verbose=False) as cap:
                cap(model, torch.randn(4, 8))
            out[tracer, kind] = str(prefix)
    return out


@pytest.mark.parametrize("tracer", TRACERS)
@pytest.mark.parametrize(("old", "new", "shows"), [("relu", "silu", "silu"), ("eps5", "eps6", "1e-06")])
def test_a_change_to_the_captured_graph_is_the_graph_category_with_its_lines(graph_releases, capsys, tracer, old, new, shows):
    """An activation or an epsilon literal in forward changes what a served call computes: `graph`,
    gated, for both tracers (issue 51, item 5: MakeFx's landed in `code`, not gated by the recipe),
    and the PR comment shows the graph's changed lines, not only their count."""
    a, b = graph_releases[tracer, old], graph_releases[tracer, new]
    rc, report = _diff(capsys, a, b, "--fail-on", "graph")
    assert rc == 1 and report["categories"].get("graph"), report["categories"]
    assert all(code["section"].startswith("graph") for code in report["python_code"]
               if code["section"].startswith("graph")), report["python_code"]
    rc, out, _ = run_cli(capsys, ["diff", "--format", "markdown", "--fail-on", "graph", a, b])
    assert rc == 1 and "| graph |" in out and "fails" in out.split("| graph |")[1].splitlines()[0]
    graph_part = out.split("#### graph")[1]
    assert "```diff" in graph_part and any(line.startswith("+") and shows in line for line in graph_part.splitlines()), out


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_candidate_whose_cache_is_another_builds_fails_every_gate(releases, capsys, tracer, tmp_path):
    """`pairs: yes -> no` was a metadata difference, which a gate not naming metadata passed (issue 51, item 6)."""
    base, other = releases[tracer, "base"], releases[tracer, "scale"]
    shutil.copy(f"{base}.py", tmp_path / "candidate.py")
    shutil.copy(f"{other}.cache", tmp_path / "candidate.cache")
    candidate = str(tmp_path / "candidate")
    for gate in CATEGORIES:
        rc, report = _diff(capsys, base, candidate, "--fail-on", gate)
        assert rc == 1 and report["unpaired"] == ["b"], (gate, report)
    rc, out, _ = run_cli(capsys, ["diff", "--format", "markdown", "--fail-on", "guards", base, candidate])
    assert rc == 1 and "fails every gate" in out.splitlines()[0] and "| guards | " in out


def test_a_release_signed_by_another_key_is_a_difference(releases, capsys, tmp_path, monkeypatch):
    from precompile.signing import generate, sign_pair

    monkeypatch.chdir(tmp_path)
    pairs = {}
    for name in ("first", "second"):
        generate(tmp_path / name)
        (tmp_path / name / "m").mkdir(parents=True)
        for suffix in (".py", ".cache"):
            shutil.copy(releases["makefx", "base"] + suffix, tmp_path / name / "m" / f"model{suffix}")
        pairs[name] = str(tmp_path / name / "m" / "model")
        sign_pair(f"{pairs[name]}.py", f"{pairs[name]}.cache", tmp_path / f"{name}.key", name="demo", release="1")
    rc, report = _diff(capsys, pairs["first"], pairs["second"], "--fail-on", "versions")
    (entry,) = [e for e in report["entries"] if e["key"] == "signed by"]
    assert rc == 1 and entry["a"] != entry["b"] and entry["a"].startswith("key SHA256:"), report["entries"]


def test_a_long_value_is_cut_around_the_part_that_changed(capsys):
    """A guard value of thousands of characters that changed near its end showed only its shared head
    (issue 51, item 6): both renderings show the part that differs."""
    from precompile.inspect.model.report import DiffEntry, DiffReport
    from precompile.inspect.render.render_markdown import render_markdown
    from precompile.inspect.render.render_text import render_diff

    head = "CONSTANT_MATCH model.table == (" + ", ".join(str(i) for i in range(1500))
    entry = DiffEntry(section="guards", key="CONSTANT_MATCH model.table", change="changed", a=head + ", 7777)", b=head + ", 8888)")
    report = DiffReport(a="a.py", b="b.py", equal=False, entries=(entry,), categories={"guards": 1})
    markdown = render_markdown(report)
    text = "\n".join(line for line, _ in render_diff(report))
    for shown in (markdown, text):
        assert "7777" in shown and "8888" in shown, shown[-1500:]


@pytest.fixture(scope="module")
def installed_releases(tmp_path_factory) -> dict[str, str]:
    """Releases of a model whose graph break sits in a child's forward, served installed (its guards
    rebuilt at load from the pickled state): base, scale 0.5, hidden 64."""
    from gate_model import Outer, PrintingScaled

    directory = tmp_path_factory.mktemp("installed-releases")
    out = {}
    for name, (scale, hidden) in {"base": (1.0, 32), "again": (1.0, 32), "scale": (0.5, 32), "hidden": (1.0, 64)}.items():
        torch.manual_seed(0)
        model = Outer(PrintingScaled(hidden))
        model.inner.scale = scale
        prefix = directory / name
        with precompile.capture(step, artifact_path=f"{prefix}.py", cache_path=f"{prefix}.cache",
                                tracer=precompile.DynamoTracer(), backend="eager", verbose=False) as cap:
            cap(model, torch.randn(4, 8))
        out[name] = str(prefix)
    assert "SERVING_MODE = 'installed'" in Path(f"{out['base']}.py").read_text(encoding="utf-8")
    return out


def test_an_installed_artifact_shows_guard_values_and_parameter_shapes_in_their_categories(installed_releases, capsys):
    """An installed artifact's guard values and parameter shapes showed only as a changed opaque
    fingerprint in `code` (issue 51, item 4): they land in guards and params, as for a standalone one."""
    base = installed_releases["base"]
    rc, report = _diff(capsys, base, installed_releases["again"], "--fail-on", ",".join(CATEGORIES))
    assert rc == 0 and report["equal"], report["entries"]
    rc, report = _diff(capsys, base, installed_releases["scale"], "--fail-on", "guards")
    scale = [e for e in report["entries"] if e["section"] == "guards" and e["key"].endswith("scale")]
    assert rc == 1 and len(scale) == 1 and "1.0" in scale[0]["a"] and "0.5" in scale[0]["b"], report["entries"]
    rc, report = _diff(capsys, base, installed_releases["hidden"], "--fail-on", "params")
    params = {e["key"]: e for e in report["entries"] if e["section"] in ("params", "buffers")}
    assert rc == 1 and "(32, 8)" in params["fc.weight"]["a"] and "(64, 8)" in params["fc.weight"]["b"], report["entries"]
