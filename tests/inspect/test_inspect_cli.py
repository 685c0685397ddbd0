"""Every inspect verb on every fixture: text output locked by snapshots, exit codes checked."""
from __future__ import annotations

import json
import shutil

import pytest

from precompile.artifact.bundle_keys import host_keys
from test_inspect_helpers import ALL, FIXTURES, ROOT, run_cli

SHOW_RC = {
    "v1/mlp": 0, "v1/mlp_b4": 0, "v1/mlp_inductor": 0, "v1/two_modules": 0, "v1/train_step": 0,
    "v1/dynamo_break": 0, "v1/dynamo_break_eager": 0, "v1/dynamo_rows": 0, "v1/dynamo_rows_risky": 0,
    "v1/dynamo_installed": 0, "v1/dynamo_lowered": 0,
    "damaged/truncated": 2, "damaged/bitflip": 0, "damaged/mismatched": 1, "damaged/foreign": 2,
    "damaged/newer": 2, "damaged/upstream": 2, "damaged/poisoned": 2, "hostile/dynamo_os_system": 1,
}
VERIFY_RC = {
    "v1/mlp": 0, "v1/mlp_b4": 0, "v1/mlp_inductor": 0, "v1/two_modules": 0, "v1/train_step": 0,
    "v1/dynamo_break": 0, "v1/dynamo_break_eager": 0, "v1/dynamo_rows": 0, "v1/dynamo_rows_risky": 0,
    "v1/dynamo_installed": 0, "v1/dynamo_lowered": 0,
    "damaged/truncated": 2, "damaged/bitflip": 1, "damaged/mismatched": 1, "damaged/foreign": 2,
    "damaged/newer": 2, "damaged/upstream": 2, "damaged/poisoned": 2, "hostile/dynamo_os_system": 1,
}
"""A file that cannot be read as what it claims (a truncated, foreign or upstream cache) is 2, as
`show` says; a pair read whose checks fail (a flipped payload bit, another python_code) is 1."""
UNREADABLE = ("damaged/newer", "damaged/upstream", "damaged/truncated", "damaged/foreign", "damaged/poisoned")
GUARDS_RC = {name: 2 if name in UNREADABLE else 1 if name.startswith("hostile/") or name == "damaged/mismatched" else 0
             for name in ALL}


@pytest.fixture(autouse=True)
def _repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    for name in ("FORCE_COLOR", "NO_COLOR", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)


def _record(rc, out, err) -> str:
    return f"exit {rc}\n--- stdout ---\n{out}--- stderr ---\n{err}"


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("verb", ["show", "guards", "verify"])
def test_verb_text(capsys, snapshot, verb, name):
    rc, out, err = run_cli(capsys, [verb, f"fixtures/{name}"])
    expected = {"show": SHOW_RC, "guards": GUARDS_RC, "verify": VERIFY_RC}[verb][name]
    assert rc == expected, err
    assert "Traceback (most recent call last)" not in out + err  # a scanned pickle may import a CapturedTraceback
    assert str(FIXTURES) not in out + err  # paths print as given, never resolved
    assert _record(rc, out, err) == snapshot


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("verb", ["show", "guards", "verify"])
def test_verb_json(capsys, verb, name):
    rc, out, err = run_cli(capsys, [verb, "--json", f"fixtures/{name}"])
    report = json.loads(out)
    assert report["verb"] == verb and report["report_version"] == "1"
    import msgspec

    from precompile.inspect.model.report import Report

    assert msgspec.json.decode(out, type=Report).report_version == "1"  # the report obeys its own schema
    rc_text, _, _ = run_cli(capsys, [verb, f"fixtures/{name}"])
    assert rc == rc_text


def test_show_json_snapshot(capsys, snapshot):
    rc, out, _ = run_cli(capsys, ["show", "--json", "fixtures/v1/mlp_inductor"])
    assert rc == 0
    assert out == snapshot


def test_verify_host(capsys):
    rc, out, err = run_cli(capsys, ["verify", "-v", "--host", "--json", "fixtures/v1/mlp"])
    report = json.loads(out)
    names = {c["name"]: c for c in report["checks"]}
    assert {"host python", "host torch"} <= set(names)
    assert rc == (0 if report["ok"] else 1)
    for check in report["checks"]:
        if check["status"] == "fail":
            assert check["expected"] and check["actual"] and check["remedy"]


def test_verify_host_mismatch_names_both_values(capsys, tmp_path, monkeypatch):
    source = (FIXTURES / "v1/mlp.py").read_text().replace("PYTHON_VERSION = (3, ", "PYTHON_VERSION = (2, ")
    (tmp_path / "old.py").write_text(source)
    shutil.copy(FIXTURES / "v1/mlp.cache", tmp_path / "old.cache")
    monkeypatch.setattr("precompile.inspect.verify.verify.host_torch_version", lambda: "9.9.9")
    rc, out, err = run_cli(capsys, ["verify", "-v", "--host", str(tmp_path / "old")])
    assert rc == 1
    assert "captured with Python 2." in out and "this host runs Python 3." in out
    assert "torch 2.13.0+cpu" in out and "torch 9.9.9" in out and "remedy: install torch==" in out


DIFFS = [
    ("v1/mlp", "v1/mlp", 0),
    ("v1/mlp", "v1/mlp_b4", 1),
    ("v1/mlp", "v1/mlp_inductor", 1),
    ("v1/mlp", "v1/two_modules", 1),
    ("v1/two_modules", "v1/train_step", 1),
    ("v1/mlp", "damaged/truncated", 2),
    ("v1/mlp", "damaged/newer", 2),
    ("v1/dynamo_rows", "v1/dynamo_rows_risky", 1),
    ("v1/dynamo_rows", "v1/dynamo_break", 1),
    ("v1/dynamo_break", "v1/dynamo_break_eager", 1),
]


def test_diff_of_captures_whose_guards_differ_shows_the_risky_drop_first(capsys):
    rc, out, _ = run_cli(capsys, ["diff", "fixtures/v1/dynamo_rows", "fixtures/v1/dynamo_rows_risky"])
    assert rc == 1
    lines = out.splitlines()
    assert lines[2] == "guards (1 changed)"
    assert lines[3].startswith("  ~ TENSOR_MATCH x: kept in scale_rows#0 -> risky_dropped: ")


@pytest.mark.parametrize(("a", "b", "expected"), DIFFS)
def test_diff(capsys, snapshot, a, b, expected):
    rc, out, err = run_cli(capsys, ["diff", f"fixtures/{a}", f"fixtures/{b}"])
    assert rc == expected, err
    assert _record(rc, out, err) == snapshot
    rc_json, out_json, _ = run_cli(capsys, ["diff", "--json", f"fixtures/{a}", f"fixtures/{b}"])
    assert rc_json == rc and json.loads(out_json)["equal"] == (rc == 0)


def test_diff_shows_the_difference_first(capsys):
    rc, out, _ = run_cli(capsys, ["diff", "fixtures/v1/mlp", "fixtures/v1/mlp_b4"])
    assert rc == 1
    lines = out.splitlines()
    assert lines[:4] == [
        "--- fixtures/v1/mlp.py",
        "+++ fixtures/v1/mlp_b4.py",
        "inputs (1 changed)",
        "  ~ args[1]: tensor (8, 8) torch.float32 cpu -> tensor (4, 8) torch.float32 cpu",
    ]


def test_diff_keys_by_identity_not_position(tmp_path):
    from precompile.inspect.diff.diff import diff
    from precompile.inspect.reading.reader import open_artifact

    source = (FIXTURES / "v1/mlp.py").read_text()
    start = source.index("PARAMS = (") + len("PARAMS = (")
    end = source.index(")\nBUFFERS")
    entries = source[start:end].split(",\n ")
    swapped = source[:start] + ",\n ".join([entries[1], entries[0], *entries[2:]]) + source[end:]
    (tmp_path / "s.py").write_text(swapped)
    a = open_artifact(str(FIXTURES / "v1/mlp.py"), str(FIXTURES / "v1/mlp.cache"))
    b = open_artifact(str(tmp_path / "s.py"), str(tmp_path / "missing.cache"))
    report = diff(a, b, None, None)
    assert not [e for e in report.entries if e.section == "params"]


def test_extract(capsys, snapshot, tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()
    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / f"v1/mlp_inductor{suffix}", tmp_path / f"in/mlp_inductor{suffix}")
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, ["extract", "in", "out"])
    assert rc == 0, err
    assert _record(rc, out, err) == snapshot
    from precompile.artifact.codec import decode_header

    envelope, _ = decode_header((FIXTURES / "v1/mlp_inductor.cache").read_bytes())
    kernel = next(f for f in envelope.bundle.files if f.kind == "kernel-source")
    assert (tmp_path / "out/bundle" / kernel.path).read_bytes().lstrip().startswith(b"#include")
    sections = sorted(p.name for p in (tmp_path / "out/python_code").iterdir())
    assert sections == ["00-header.py", "01-metadata.py", "02-kernel-runtime.py", "03-graph.py", "04-driver.py"]
    joined = b"".join((tmp_path / "out/python_code" / n).read_bytes() for n in sections)
    assert joined == (FIXTURES / "v1/mlp_inductor.py").read_bytes()
    rc, _, err = run_cli(capsys, ["extract", "in", "out"])
    assert rc == 2 and "not empty" in err


@pytest.mark.parametrize("name", ALL)
def test_extract_every_fixture(capsys, tmp_path, name):
    rc, out, err = run_cli(capsys, ["extract", "--json", f"fixtures/{name}", str(tmp_path / "x")])
    assert rc == (2 if json.loads(out)["problems"] else 0)
    assert "Traceback" not in err


def test_extract_refuses_escaping_bundle_paths(capsys, tmp_path):
    from precompile.artifact.codec import build_bundle, decode_header, encode_cache
    import msgspec

    data = (FIXTURES / "v1/mlp.cache").read_bytes()
    envelope, _ = decode_header(data)
    bundle, payload = build_bundle({"../evil.py": ("source", b"x")}, {})
    (tmp_path / "e.cache").write_bytes(encode_cache(msgspec.structs.replace(envelope, bundle=bundle), payload))
    shutil.copy(FIXTURES / "v1/mlp.py", tmp_path / "e.py")
    rc, _, err = run_cli(capsys, ["extract", str(tmp_path / "e"), str(tmp_path / "out")])
    # the codec refuses the entry, so extract writes no bundle file at all
    assert rc == 2 and "bundle entry '../evil.py' is refused: it has a '..' part" in err
    assert not (tmp_path / "evil.py").exists() and not (tmp_path / "out" / "bundle").exists()


def test_schema(capsys):
    from precompile.artifact.jsonschema import committed

    rc, out, _ = run_cli(capsys, ["schema"])
    assert rc == 0
    schemas = json.loads(out)
    assert set(schemas) == {"cache-envelope", "python-code-metadata", "inspect-report"}
    rc, out, _ = run_cli(capsys, ["schema", "cache-envelope"])
    assert out == committed("cache-envelope.schema.json")


def test_report_schema_committed():
    from precompile.inspect.model.report import SCHEMA_PATH, render_schema

    assert SCHEMA_PATH.read_text(encoding="utf-8") == render_schema(), (
        "precompile/inspect/model/report.schema.json drifted: run python -m precompile.inspect.model.report"
    )


def test_guards_filters(capsys):
    rc, out, _ = run_cli(capsys, ["guards", "--json", "--type", "shape", "fixtures/v1/two_modules"])
    guards = json.loads(out)["guards"]
    assert rc == 0 and guards["has_guards"] is False
    assert [s["path"] for s in guards["specializations"]] == ["args[2]"]
    rc, out, _ = run_cli(capsys, ["guards", "--json", "--risky", "fixtures/v1/two_modules"])
    assert json.loads(out)["guards"]["specializations"] == []


def test_pair_resolution(capsys, tmp_path, monkeypatch):
    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / f"v1/mlp{suffix}", tmp_path / f"m{suffix}")
    monkeypatch.chdir(tmp_path)
    for argv in (["m.py", "m.cache"], ["."], ["m"], ["m.py"], ["m.cache"]):
        rc, out, err = run_cli(capsys, ["show", *argv])
        assert rc == 0, (argv, err)
        assert "pairs: yes" in out
    rc, out, err = run_cli(capsys, ["show", "m.cache", "m.py"])
    assert rc == 2 and err.startswith("precompile: error: m.cache is not UTF-8") and "swapped" in err
    rc, _, err = run_cli(capsys, ["show", "nothing"])
    assert rc == 2 and err.startswith("precompile: error: nothing is neither")


def test_color_only_when_asked(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    from precompile.cli.main import main

    capsys.readouterr()
    main(["--color", "always", "show", "fixtures/damaged/mismatched"])
    assert "\x1b[" in capsys.readouterr().out
    rc, out, _ = run_cli(capsys, ["show", "fixtures/damaged/mismatched"])
    assert "\x1b[" not in out


def test_help_lists_verbs(capsys):
    rc, out, _ = run_cli(capsys, ["--help"])
    for verb in ("show", "guards", "diff", "verify", "extract", "report", "schema"):
        assert verb in out


def test_verify_host_says_when_the_kernel_bundle_does_not_fit_this_host(capsys, tmp_path):
    import msgspec

    from precompile.artifact import codec

    for suffix in (".py", ".cache"):
        shutil.copy(FIXTURES / f"v1/mlp_inductor{suffix}", tmp_path / f"m{suffix}")
    data = (tmp_path / "m.cache").read_bytes()
    envelope, offset = codec.decode_header(data)
    keys = {**envelope.bundle.keys, "torch_dir": "/elsewhere/torch", "torch_git": "0" * 40, "cpu_flags": "amx_nonesuch avx512f"}
    changed = msgspec.structs.replace(envelope, bundle=msgspec.structs.replace(envelope.bundle, keys=keys))
    (tmp_path / "m.cache").write_bytes(codec.encode_cache(changed, data[offset:]))
    rc, out, err = run_cli(capsys, ["verify", "-v", "--host", str(tmp_path / "m")])
    assert rc == 1, err
    assert f"FAIL  host kernels requirement torch_git: torch_git is '{host_keys()['torch_git']}' here but '{'0' * 40}' where it was captured" in out
    # a flag no CPU has (this suite runs on CPUs with AMX too): it names what the capturing CPU had
    assert "lacks instruction-set flags of the capturing CPU: amx_nonesuch" in out
    assert "remedy: serving here compiles the kernels again" in out
    # where torch was installed is provenance: shown beside this host's, never a failure
    assert "ok    host kernels provenance torch_dir: captured with /elsewhere/torch, here " in out
    assert "FAIL  host kernels provenance" not in out


def test_verify_host_takes_an_old_bundles_paths_as_provenance(capsys):
    """fixtures/v1/dynamo_rows (kept as written) was captured in another checkout's venv; its keys held
    torch_dir and python_include as requirements then. Here they are provenance: shown, never failed.
    (Whether this CPU has the capturing CPU's flags depends on the machine the suite runs on.)"""
    from importlib.metadata import version

    rc, out, err = run_cli(capsys, ["verify", "-v", "--host", "fixtures/v1/dynamo_rows"])
    assert rc in (0, 1), out + err
    assert "ok    host kernels provenance torch_dir: captured with /work/main/.venv/lib/python3.11/site-packages/torch" in out
    assert "ok    host kernels provenance python_include: captured with " in out
    # The pinned torch is the build the fixture was captured with; a compat run's torch is another.
    same_build = version("torch") == "2.13.0+cpu"
    assert ("ok    host kernels requirement torch: 2.13.0+cpu" in out) is same_build
    failed = [line for line in out.splitlines() if line.startswith("  FAIL")]
    allowed = ("  FAIL  host kernels requirement cpu_flags",) + (
        () if same_build else ("  FAIL  host kernels requirement torch", "  FAIL  host torch:", "  FAIL  host kernels requirement torch_git")
    )
    # it predates the requirements every capture now records: those are named as missing (load does not serve it)
    missing = [line for line in failed if "the bundle does not record" in line]
    assert {line.split()[4].rstrip(":") for line in missing} == {"torch_git", "torch_debug", "torch_cuda", "python_abi", "valid_isas"}
    assert all(line.startswith(allowed) for line in failed if line not in missing), failed


def test_upstream_caches_diff_by_field_and_extract_their_members_raw(capsys, tmp_path):
    import zipfile

    rc, out, _ = run_cli(capsys, ["diff", "fixtures/damaged/upstream", "fixtures/damaged/poisoned"])
    assert rc == 2  # neither side is a precompile pair, but what differs is still shown
    assert "+ archive/data.pkl: imports posix.system: dangerous" in out
    assert "- archive/data.pkl: python_code_sha256: '" in out
    rc, out, _ = run_cli(capsys, ["extract", "fixtures/damaged/upstream", str(tmp_path / "out")])
    with zipfile.ZipFile(FIXTURES / "damaged/upstream.cache") as archive:
        assert (tmp_path / "out/cache/archive/data.pkl").read_bytes() == archive.read("archive/data.pkl")


def test_guards_filters_name_what_they_accept_and_show_what_tensor_guards_check(capsys):
    rc, out, err = run_cli(capsys, ["guards", "fixtures/v1/dynamo_lowered", "--type", "shpe"])
    assert rc == 2 and "--type 'shpe' selects nothing in this artifact; it has: " in err and "shape" in err
    rc, out, err = run_cli(capsys, ["guards", "fixtures/v1/dynamo_lowered", "--frame", "7"])
    assert rc == 2 and "--frame '7' names no frame or variant of this artifact; it has: " in err
    rc, out, err = run_cli(capsys, ["guards", "fixtures/v1/dynamo_lowered", "--type", "shape"])
    assert rc == 0
    assert "TENSOR_MATCH     x  Tensor torch.float32 on cpu, size (3, 6), stride (6, 1), requires_grad=False" in out
    frames = out.split("\nframe ")[1:]
    for frame in frames:  # no guard listed twice within a variant
        rows = [line for line in frame.splitlines() if line.startswith("  kept")]
        assert len(rows) == len(set(rows)) and all("TENSOR_MATCH" in r or "SHAPE_ENV" in r for r in rows)


def test_verify_prints_the_verdict_and_only_what_failed_unless_asked_for_every_check(capsys):
    rc, out, _ = run_cli(capsys, ["verify", "fixtures/v1/dynamo_lowered"])
    assert rc == 0 and out.splitlines()[1:] == ["verified: ok (20 checks: 19 ok, 0 failed, 1 skipped; -v lists every check)"]
    rc, out, _ = run_cli(capsys, ["verify", "-v", "fixtures/v1/dynamo_lowered"])
    assert len(out.splitlines()) == 22 and out.splitlines()[-1] == "verified: ok (20 checks: 19 ok, 0 failed, 1 skipped)"


def test_show_ends_with_a_verdict_counting_the_findings(capsys):
    rc, out, _ = run_cli(capsys, ["show", "fixtures/v1/mlp"])
    assert rc == 0 and out.splitlines()[-1] == "verdict: 0 findings: nothing flagged"
    rc, out, err = run_cli(capsys, ["show", "fixtures/damaged/poisoned.py", "fixtures/damaged/poisoned_raw.pkl"])
    assert out.splitlines()[-1].startswith("verdict: ") and "finding" in out.splitlines()[-1]


def test_diff_gates_a_release_by_category(capsys):
    pair = ["fixtures/v1/mlp", "fixtures/v1/mlp_b4"]  # the batch grew from 4 to 8: the calling convention changed
    rc, out, _ = run_cli(capsys, ["diff", *pair])
    assert rc == 1 and out.splitlines()[-1] == "verdict: differ in calling-convention (2), code (1)"
    assert run_cli(capsys, ["diff", "--fail-on", "guards,kernels,params", *pair])[0] == 0
    assert run_cli(capsys, ["diff", "--fail-on", "calling-convention", *pair])[0] == 1
    rc, out, _ = run_cli(capsys, ["diff", "--stat", *pair])
    assert rc == 1 and out.splitlines()[2:] == [
        "  calling-convention       2 differences", "  code                     1 difference",
        "verdict: differ in calling-convention (2), code (1)"]
    rc, _, err = run_cli(capsys, ["diff", "--fail-on", "guard", *pair])
    assert rc == 2 and "guard is not one of guards, calling-convention" in err
    rc, out, _ = run_cli(capsys, ["diff", "--json", "--fail-on", "code", *pair])
    assert rc == 1 and json.loads(out)["categories"] == {"calling-convention": 2, "code": 1}


def test_diff_masks_the_prefix_each_artifact_gives_its_names(capsys, tmp_path):
    import re

    source = (FIXTURES / "v1/dynamo_lowered.py").read_text(encoding="utf-8")
    prefix = re.search(r"__precompile_([0-9a-f]{12})_", source).group(1)
    (tmp_path / "a.py").write_text(source, encoding="utf-8")
    (tmp_path / "b.py").write_text(source.replace(prefix, "0123456789ab"), encoding="utf-8")
    rc, out, _ = run_cli(capsys, ["diff", str(tmp_path / "a.py"), str(tmp_path / "b.py")])
    assert rc == 0 and out.splitlines()[-1] == "verdict: equal"
