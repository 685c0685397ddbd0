"""One stdout and exit-code convention for every inspect verb (docs/inspect.md has the table):
0 clean, 1 a finding, 2 trouble (an input that cannot be read as what it claims, a wrong option);
with --json, stdout is always one JSON object, an error object where there is no report to make."""
from __future__ import annotations

import json
import shutil

import pytest

from test_inspect_helpers import FIXTURES, run_cli

MISSING_ARGS = {
    "show": ["{missing}"], "guards": ["{missing}"], "verify": ["{missing}"], "extract": ["{missing}", "{out}"],
    "report": ["{missing}", "-o", "{out}.html"], "diff": ["{missing}", "{missing}"],
}


@pytest.mark.parametrize("verb", sorted(MISSING_ARGS))
def test_json_of_a_missing_artifact_is_an_error_object_on_stdout_and_the_message_on_stderr(verb, tmp_path, capsys):
    missing, out = str(tmp_path / "nothing.py"), str(tmp_path / "out")
    argv = [verb, "--json", *(a.format(missing=missing, out=out) for a in MISSING_ARGS[verb])]
    rc, stdout, stderr = run_cli(capsys, argv)
    assert rc == 2
    error = json.loads(stdout)
    assert error["verb"] == verb and error["report_version"] == "1"
    assert "nothing.py" in error["error"] and error["error"] in stderr
    assert stderr.startswith("precompile: error: ")


def test_text_of_a_missing_artifact_prints_nothing_on_stdout(tmp_path, capsys):
    rc, stdout, stderr = run_cli(capsys, ["show", str(tmp_path / "nothing.py")])
    assert (rc, stdout) == (2, "") and "nothing.py" in stderr


@pytest.fixture
def garbage_cache(tmp_path):
    shutil.copy(FIXTURES / "v1/dynamo_rows.py", tmp_path / "g.py")
    (tmp_path / "g.cache").write_bytes(bytes(range(256)) * 4)
    return [str(tmp_path / "g.py"), str(tmp_path / "g.cache")]


@pytest.mark.parametrize("verb", ["show", "guards", "verify"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_garbage_cache_is_trouble_for_every_verb(verb, as_json, garbage_cache, capsys):
    """main exited 2 from show, 0 from guards and 1 from verify."""
    rc, stdout, stderr = run_cli(capsys, [verb, *garbage_cache] + (["--json"] if as_json else []))
    assert rc == 2, stderr
    assert "precompile: error:" in stderr and "g.cache" in stderr
    if as_json:
        assert json.loads(stdout)["verb"] == verb


def test_a_cache_that_reads_but_fails_a_check_is_a_finding(tmp_path, capsys):
    """verify's 1 is for a pair it could read and whose checks fail: a flipped payload bit."""
    pair = [str(FIXTURES / "damaged/bitflip.py"), str(FIXTURES / "damaged/bitflip.cache")]
    rc, stdout, stderr = run_cli(capsys, ["verify", "--json", *pair])
    assert rc == 1 and json.loads(stdout)["ok"] is False
    assert "precompile: warning:" in stderr


@pytest.mark.parametrize("verb", ["show", "guards"])
def test_a_cache_that_does_not_pair_is_a_finding_that_names_both_files(verb, tmp_path, capsys):
    """guards printed the checks of python_code beside a cache of another capture and exited 0."""
    shutil.copy(FIXTURES / "v1/dynamo_rows.py", tmp_path / "a.py")
    shutil.copy(FIXTURES / "v1/dynamo_lowered.cache", tmp_path / "a.cache")
    rc, stdout, stderr = run_cli(capsys, [verb, str(tmp_path / "a.py"), str(tmp_path / "a.cache")])
    assert rc == 1 and stdout
    assert f"precompile: warning: {tmp_path / 'a.cache'} does not pair with {tmp_path / 'a.py'}" in " ".join(stderr.split())
