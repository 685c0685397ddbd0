# ruff: noqa: F811
"""Artifacts at fsspec URLs: the inspect verbs and load() against a real S3 server on the loopback
(moto's server, reached by s3fs through AWS_ENDPOINT_URL with dummy credentials; no client is mocked)
and a plain HTTP server; the local fetch cache they go through."""
from __future__ import annotations

import functools
import http.server
import io
import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT, TESTS, run_fresh

# the fixtures, used by name (pytest injects them: F811 is their use as arguments)
from remote_servers import BUCKET, eager_pair, http_root, s3, s3_server  # noqa: F401

from precompile.errors import PrecompileError

LOAD = """
import json, sys
import torch
import precompile
from cases import CASES
case = CASES["mlp_batchnorm"]
served = precompile.load(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))
args = case.args(seed=1)
with torch.no_grad():  # as captured
    diff = (served(*args) - case.fn(*args)).abs().max().item()
print(json.dumps({"max_abs_diff": diff, "cache_used": served.cache_used}))
"""


def _upload(s3, pair: tuple[Path, Path], prefix: str, name: str = "mlp") -> str:
    for path, suffix in zip(pair, (".py", ".cache")):
        s3.put(str(path), f"{BUCKET}/{prefix}/{name}{suffix}")
    return f"s3://{BUCKET}/{prefix}/{name}"


def _cli(*argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "precompile", "--color", "never", *argv], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **env, "PYTHONPATH": str(ROOT)})


def _load(python_code: str, cache: str, env: dict, **kwargs) -> dict:
    proc = run_fresh(LOAD, python_code, cache, json.dumps(kwargs), env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def fetch_cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "fetch"
    monkeypatch.setenv("PRECOMPILE_FETCH_CACHE", str(root))
    return root


@pytest.mark.slow  # fresh processes
def test_show_verify_and_diff_read_an_s3_artifact_in_every_form_a_local_path_takes(s3, s3_server, eager_pair, fetch_cache):
    _, _, env = s3_server
    env = {**env, "PRECOMPILE_FETCH_CACHE": str(fetch_cache)}
    prefix = _upload(s3, eager_pair["mlp_batchnorm"], "cli")
    for given in ([prefix], [f"{prefix}.py"], [f"s3://{BUCKET}/cli/"], [f"{prefix}.py", f"{prefix}.cache"]):
        proc = _cli("show", *given, env=env)
        assert proc.returncode == 0, proc.stderr
        assert f"{prefix}.py" in proc.stdout and f"{prefix}.cache" in proc.stdout
        assert str(fetch_cache) not in proc.stdout + proc.stderr  # the URL is shown, not where it was fetched to
    guards = _cli("guards", f"{prefix}.py", f"{prefix}.cache", env=env)
    assert guards.returncode == 0, guards.stderr
    verify = _cli("verify", prefix, "--json", env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert json.loads(verify.stdout)["ok"] is True
    local = str(eager_pair["mlp_batchnorm"][0])[:-3]
    assert _cli("diff", prefix, local, env=env).returncode == 0
    other = _upload(s3, eager_pair["plain_function"], "cli-other")
    different = _cli("diff", prefix, other, env=env)
    assert different.returncode == 1, different.stderr
    missing = _cli("show", f"s3://{BUCKET}/cli/nothing", env=env)
    assert missing.returncode == 2
    assert f"s3://{BUCKET}/cli/nothing is neither a directory with one pair" in missing.stderr


@pytest.mark.slow  # fresh processes
def test_load_from_s3_serves_like_eager_and_the_next_load_reuses_the_fetch_cache(s3, s3_server, eager_pair, fetch_cache):
    _, log, env = s3_server
    prefix = _upload(s3, eager_pair["mlp_batchnorm"], "load")
    env = {**env, "PRECOMPILE_FETCH_CACHE": str(fetch_cache)}
    first = _load(f"{prefix}.py", f"{prefix}.cache", env)
    assert first == {"max_abs_diff": 0.0, "cache_used": True}
    fetched = log.gets("load/mlp.cache")
    assert fetched >= 1
    objects = sorted((fetch_cache / "objects").iterdir())
    assert [p.name for p in objects] == sorted(__import__("hashlib").sha256(p.read_bytes()).hexdigest() for p in objects)
    assert stat.S_IMODE(fetch_cache.stat().st_mode) == 0o700
    assert _load(f"{prefix}.py", f"{prefix}.cache", env) == first
    assert log.gets("load/mlp.cache") == fetched  # reused: the store's ETag was unchanged, nothing downloaded again


@pytest.mark.slow  # fresh processes
def test_two_loads_at_once_into_an_empty_fetch_cache_both_serve(s3, s3_server, eager_pair, fetch_cache):
    _, _, env = s3_server
    prefix = _upload(s3, eager_pair["mlp_batchnorm"], "ranks")
    env = {**os.environ, **env, "PRECOMPILE_FETCH_CACHE": str(fetch_cache), "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    procs = [subprocess.Popen([sys.executable, "-c", LOAD, f"{prefix}.py", f"{prefix}.cache", "{}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
        assert json.loads(out.strip().splitlines()[-1]) == {"max_abs_diff": 0.0, "cache_used": True}
    assert not [p for p in fetch_cache.rglob(".*")]  # no temporary file left behind


@pytest.mark.slow  # fresh processes
def test_a_remote_pair_is_checked_as_a_local_one_signature_pins_included(s3, s3_server, eager_pair, fetch_cache, tmp_path):
    pytest.importorskip("cryptography")
    from precompile.signing import generate, sign_pair

    _, _, env = s3_server
    env = {**env, "PRECOMPILE_FETCH_CACHE": str(fetch_cache)}
    python_code, cache = eager_pair["mlp_batchnorm"]
    generate(tmp_path / "release")
    local = tmp_path / "mlp"
    for suffix, source in ((".py", python_code), (".cache", cache)):
        local.with_suffix(suffix).write_bytes(source.read_bytes())
    sign_pair(local.with_suffix(".py"), local.with_suffix(".cache"), tmp_path / "release.key")
    prefix = _upload(s3, (local.with_suffix(".py"), local.with_suffix(".cache")), "signed")
    s3.put(str(local.with_suffix(".sig")), f"{BUCKET}/signed/mlp.sig")
    pinned = {"trusted_keys": [str(tmp_path / "release.pub")]}
    assert _load(f"{prefix}.py", f"{prefix}.cache", env, **pinned)["cache_used"] is True
    verify = _cli("verify", prefix, "--trusted-key", str(tmp_path / "release.pub"), env=env)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    s3.pipe(f"{BUCKET}/signed/mlp.cache", eager_pair["plain_function"][1].read_bytes())  # another capture's cache
    refused = run_fresh(LOAD, f"{prefix}.py", f"{prefix}.cache", json.dumps(pinned), env=env)
    assert refused.returncode != 0
    assert (f"refusing to load the pair ({prefix}.py, {prefix}.cache): cache {prefix}.cache is not the file {prefix}.sig covers: "
            "it changed after the pair was signed") in refused.stderr
    unpinned = run_fresh(LOAD, f"{prefix}.py", f"{prefix}.cache", "{}", env=env)
    assert f"PairMismatch: the pair ({prefix}.py, {prefix}.cache) came from different captures" in unpinned.stderr


def test_the_fetch_cache_refetches_a_changed_object_and_never_uses_a_copy_altered_in_it(s3, s3_server, fetch_cache):
    from precompile.storage.fetch_cache import fetch

    url = f"s3://{BUCKET}/objects/blob.cache"
    s3.pipe(url, b"first")
    first = fetch(url, "cache", 100)
    assert (first.data, first.reused) == (b"first", False)
    assert fetch(url, "cache", 100).reused is True
    s3.pipe(url, b"second")
    changed = fetch(url, "cache", 100)
    assert (changed.data, changed.reused) == (b"second", False)
    os.chmod(changed.path, 0o600)
    changed.path.write_bytes(b"altered")  # the cached copy no longer hashes to its name
    again = fetch(url, "cache", 100)
    assert (again.data, again.reused) == (b"second", False)
    with pytest.raises(PrecompileError, match=r"blob.cache is 6 bytes, over the 5-byte limit"):
        fetch(url, "cache", 5)


def test_the_python_api_opens_an_s3_artifact(s3, s3_server, eager_pair, fetch_cache):
    from precompile.inspect import api

    prefix = _upload(s3, eager_pair["mlp_batchnorm"], "api")
    artifact = api.open_path(prefix)
    assert artifact.pairs is True and api.problems_of(artifact) == ()
    assert api.show_report(artifact).problems == ()
    assert Path(artifact.python_code.path).is_relative_to(fetch_cache)


def test_a_fetch_cache_another_user_could_write_is_refused(s3, s3_server, tmp_path, monkeypatch):
    from precompile.storage.fetch_cache import fetch

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("PRECOMPILE_FETCH_CACHE", str(shared / "fetch"))
    with pytest.raises(PrecompileError, match=r"is writable by group and others \(mode 0777\).*set PRECOMPILE_FETCH_CACHE"):
        fetch(f"s3://{BUCKET}/objects/anything", "cache", 100)


@pytest.mark.slow  # fresh processes
def test_an_http_url_keeps_its_double_slash_in_show_and_load(http_root, eager_pair, fetch_cache):
    base, root = http_root
    for path, suffix in zip(eager_pair["mlp_batchnorm"], (".py", ".cache")):
        (root / f"mlp{suffix}").write_bytes(path.read_bytes())
    env = {"PRECOMPILE_FETCH_CACHE": str(fetch_cache)}
    proc = _cli("show", f"{base}/mlp.py", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"{base}/mlp.py" in proc.stdout
    page = fetch_cache.parent / "report.html"
    report = _cli("report", f"{base}/mlp", "-o", str(page), env=env)
    assert report.returncode == 0, report.stderr
    html = page.read_text(encoding="utf-8")
    assert f"{base}/mlp.py" in html and str(fetch_cache) not in html
    assert _load(f"{base}/mlp.py", f"{base}/mlp.cache", env) == {"max_abs_diff": 0.0, "cache_used": True}


def test_load_says_what_it_takes_when_given_bytes_or_one_url_and_one_path(fetch_cache):
    import precompile

    with pytest.raises(PrecompileError, match=r"load: the artifact_path is a BytesIO, not a location: pass a path"):
        precompile.load(io.BytesIO(b"forward = None"), "x.cache")
    with pytest.raises(PrecompileError, match=r"pass both files as URLs or both as local paths"):
        precompile.load("s3://bucket/x.py", "x.cache")


@pytest.mark.parametrize(("missing", "expected"), [
    ("fsspec", "s3://bucket/step.py is a URL, and reading URLs needs fsspec: pip install 'precompile[remote]'"),
    ("s3fs", "s3://bucket/step.py: the backend for this URL is not installed (Install s3fs to access S3); "
             "pip install 'precompile[remote]' installs s3://"),
])
def test_without_the_remote_extra_a_url_names_it(tmp_path, missing, expected):
    code = (f"import sys; sys.modules[{missing!r}] = None\n"
            "import precompile\n"
            "try:\n    precompile.load('s3://bucket/step.py', 's3://bucket/step.cache')\n"
            "except precompile.PrecompileError as exc:\n    print(exc)\n")
    proc = run_fresh(code, env={"PRECOMPILE_FETCH_CACHE": str(tmp_path / "fetch")})
    assert proc.returncode == 0, proc.stderr
    assert expected in proc.stdout


def test_a_file_url_is_fetched_like_any_other(tmp_path, fetch_cache):
    from precompile.storage.fetch_cache import fetch

    (tmp_path / "blob.cache").write_bytes(b"local")
    fetched = fetch(f"file://{tmp_path}/blob.cache", "cache", 100)
    assert (fetched.data, fetched.path.read_bytes()) == (b"local", b"local")
    with pytest.raises(PrecompileError, match=r"cache file://\S+/nothing.cache does not exist"):
        fetch(f"file://{tmp_path}/nothing.cache", "cache", 100)


@pytest.mark.parametrize("argv", [["extract", "PAIR", "s3://bucket/out"], ["report", "PAIR", "-o", "s3://bucket/out.html"]])
def test_what_a_verb_writes_goes_to_a_local_path_not_a_url(capsys, tmp_path, monkeypatch, argv):
    from test_inspect_helpers import FIXTURES, run_cli

    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(capsys, [str(FIXTURES / "v1" / "mlp") if a == "PAIR" else a for a in argv])
    assert rc == 2
    assert f"{argv[-1]} is a URL: {argv[0]} writes a local file or directory; pass a local path" in err
    assert not (tmp_path / "s3:").exists()


RANK = """
import json, sys
import torch
import torch.distributed as dist
import precompile.distributed
from cases import CASES
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
served = precompile.distributed.load_everywhere(sys.argv[3] + ".py", sys.argv[3] + ".cache")
case = CASES["mlp_batchnorm"]
args = case.args(seed=1)
with torch.no_grad():
    print(json.dumps({"max_abs_diff": (served(*args) - case.fn(*args)).abs().max().item(), "cache_used": served.cache_used}))
dist.destroy_process_group()
"""


@pytest.mark.slow  # two ranks
def test_load_everywhere_fetches_on_one_rank_and_ships_the_pair_to_the_others(s3, s3_server, eager_pair, tmp_path):
    _, log, env = s3_server
    prefix = _upload(s3, eager_pair["mlp_batchnorm"], "everywhere")
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(tmp_path / "rendezvous"), prefix], text=True,
                              env={**env, "PRECOMPILE_FETCH_CACHE": str(tmp_path / f"fetch-{rank}")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(2)]
    try:
        outputs = [proc.communicate(timeout=300) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, (out, err) in zip(procs, outputs):
        assert proc.returncode == 0, err[-4000:]
        assert json.loads(out.strip().splitlines()[-1]) == {"max_abs_diff": 0.0, "cache_used": True}
    assert log.gets("everywhere/mlp.cache") == 1  # only rank 0 downloaded it
    assert not (tmp_path / "fetch-1").exists()


def _fixture_pair(directory: Path, name: str = "mlp") -> None:
    from test_inspect_helpers import FIXTURES

    for suffix in (".py", ".cache"):
        (directory / f"{name}{suffix}").write_bytes((FIXTURES / "v1" / f"{name}{suffix}").read_bytes())


def test_verify_of_a_python_code_url_and_a_missing_cache_url_says_the_cache_does_not_exist(tmp_path, fetch_cache, capsys):
    """Not that PYTHON_CODE CACHE is wanted: it was given."""
    from test_inspect_helpers import run_cli

    _fixture_pair(tmp_path)
    missing = f"file://{tmp_path}/missing.cache"
    rc, out, err = run_cli(capsys, ["verify", f"file://{tmp_path}/mlp.py", missing])
    assert rc == 2 and f"cache {missing} does not exist; pass the URL of the file capture() wrote" in err, err
    assert "PYTHON_CODE CACHE" not in err


def test_load_names_a_missing_cache_by_its_url_not_by_a_path_in_the_fetch_cache(tmp_path, fetch_cache):
    """The fetch cache never held the missing cache: the path it would have had there names nothing."""
    import precompile
    from precompile.errors import PrecompileWarning

    _fixture_pair(tmp_path)
    code, missing = f"file://{tmp_path}/mlp.py", f"file://{tmp_path}/missing.cache"
    with pytest.warns(PrecompileWarning) as issued:
        served = precompile.load(code, missing)
    assert not served.cache_used
    said = " ".join(str(warning.message) for warning in issued)
    assert f"ignoring the cache: cache {missing} does not exist" in said and f"python_code {code} alone" in said
    assert str(fetch_cache) not in said


class _TaggedHandler(http.server.SimpleHTTPRequestHandler):
    """A plain HTTP server that gives each file an ETag (its modification time and size), as stores do."""

    def end_headers(self) -> None:
        path = Path(self.translate_path(self.path))
        if path.is_file():
            self.send_header("ETag", f'"{path.stat().st_mtime_ns}-{path.stat().st_size}"')
        super().end_headers()

    def log_message(self, format, *args) -> None:
        pass


def test_with_the_store_down_load_serves_the_checked_copies_it_fetched_before(tmp_path, fetch_cache):
    import precompile
    from precompile.errors import PrecompileWarning

    served_dir = tmp_path / "served"
    served_dir.mkdir()
    _fixture_pair(served_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_TaggedHandler, directory=str(served_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert precompile.load(f"{base}/mlp.py", f"{base}/mlp.cache").cache_used
    finally:
        server.shutdown()
        server.server_close()
    with pytest.warns(PrecompileWarning) as issued:
        served = precompile.load(f"{base}/mlp.py", f"{base}/mlp.cache")
    assert served.cache_used
    said = [str(warning.message) for warning in issued]
    for what, name in (("python_code", "mlp.py"), ("cache", "mlp.cache")):
        assert any(m.startswith(f"could not read {what} {base}/{name}: ") and "using the copy fetched before (sha256 " in m
                   for m in said), said
    with pytest.raises(PrecompileError, match=rf"could not read python_code {base}/other.py: .*; and the fetch cache "
                                              r"\S+ holds no checked copy of it: retry once the store answers"):
        precompile.load(f"{base}/other.py", f"{base}/other.cache")
