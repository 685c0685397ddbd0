"""The main job, `precompile demo`, end to end, and the library's step reports."""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import types

import pytest
import torch

import precompile


def test_demo_captures_reloads_in_a_fresh_process_and_matches_eager(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "precompile", "demo", str(tmp_path / "out")], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "match" in proc.stdout and "MISMATCH" not in proc.stdout
    assert "fresh process: load" in proc.stdout and "cache used, nothing compiled, torch._inductor not imported" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["transformer.cache", "transformer.py"]
    # piped, it says what it is doing as plain lines, each step when it starts and when it ends
    for step in ("import torch and precompile", "trace with make_fx", "lower with Inductor",
                 "serve the pair in a fresh process under no_compilation()"):
        assert f"precompile: {step} ..." in proc.stderr and f"precompile: {step} done in " in proc.stderr


def test_library_reports_steps_through_the_precompile_logger_and_prints_nothing(tmp_path, caplog, capsys):
    with caplog.at_level(logging.INFO, logger="precompile"):
        with precompile.capture(
            torch.sin, artifact_path=tmp_path / "m.py", cache_path=tmp_path / "m.cache",
            tracer=precompile.MakeFxTracer(), backend="eager",
        ) as cap:
            cap(torch.ones(3))
    messages = [r.getMessage() for r in caplog.records if r.name == "precompile"]
    assert any(m.startswith("tracing ") for m in messages)
    assert any(m.startswith("rendered python_code (") and "tracer=make_fx, backend=eager" in m for m in messages)
    assert any(m.startswith("wrote ") and "bytes" in m for m in messages)
    assert capsys.readouterr() == ("", "")


def test_cli_usage_errors_exit_2():
    proc = subprocess.run([sys.executable, "-m", "precompile", "frobnicate"], capture_output=True, text=True)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.parametrize(
    ("child", "code", "message"),
    [
        (
            subprocess.CompletedProcess([], 1, "", "Traceback (most recent call last):\n  ...\nRuntimeError: boom\n"),
            2,
            r"precompile: error: the fresh process serving \(.*transformer.py, .*transformer.cache\) failed with exit code 1: "
            r"RuntimeError: boom; run `.* -m precompile.examples.serve_demo .*` to see its whole output",
        ),
        (
            subprocess.CompletedProcess([], 0, "warming up\n", ""),
            2,
            r"precompile: error: the fresh process serving .* exited 0 but printed no report; run `",
        ),
        (
            subprocess.CompletedProcess([], 0, json.dumps({
                "load_s": 0.1, "first_call_s": 0.1, "max_abs_diff": 0.5, "cache_used": True, "inductor_imported": False,
            }), ""),
            1,
            r"precompile: error: the pair served in a fresh process differs from eager by 0.5 \(over the 0.0001 tolerance\)",
        ),
    ],
    ids=["child-crashes", "child-prints-no-report", "mismatch"],
)
def test_demo_failures_are_clear_errors_with_a_non_zero_exit(tmp_path, monkeypatch, capsys, child, code, message):
    import precompile.cli.demo as demo
    from precompile.cli.main import main

    monkeypatch.setattr(demo, "subprocess", types.SimpleNamespace(run=lambda *args, **kwargs: child))
    assert main(["--color", "never", "demo", str(tmp_path / "out"), "--backend", "eager"]) == code
    err = capsys.readouterr().err
    assert re.search(message, err.replace("\n", " ")), err
    assert "Traceback" not in err


def _fake_report(tmp_path, max_abs_diff):
    from precompile.cli.demo import DemoReport

    return DemoReport(
        directory=tmp_path, steps=[("import torch and precompile", 1.5), ("capture", 2.25)],
        artifact_path=tmp_path / "transformer.py", cache_path=tmp_path / "transformer.cache",
        served={"load_s": 0.1, "first_call_s": 0.2, "max_abs_diff": max_abs_diff, "cache_used": True, "inductor_imported": False},
    )


@pytest.mark.parametrize(("max_abs_diff", "code"), [(0.0, 0), (0.5, 1)], ids=["match", "mismatch"])
def test_demo_json_prints_the_result_as_json(tmp_path, monkeypatch, capsys, max_abs_diff, code):
    import precompile.cli.demo as demo
    from precompile.cli.main import main

    monkeypatch.setattr(demo, "run_demo", lambda directory, backend: _fake_report(tmp_path, max_abs_diff))
    assert main(["demo", str(tmp_path), "--json", "--backend", "eager"]) == code
    captured = capsys.readouterr()
    result = json.loads(captured.out)  # stdout is the JSON alone
    assert result == {
        "directory": str(tmp_path),
        "steps": [{"step": "import torch and precompile", "seconds": 1.5}, {"step": "capture", "seconds": 2.25}],
        "artifact_path": str(tmp_path / "transformer.py"),
        "cache_path": str(tmp_path / "transformer.cache"),
        "served": {"load_s": 0.1, "first_call_s": 0.2, "max_abs_diff": max_abs_diff, "cache_used": True, "inductor_imported": False},
        "tolerance": demo.TOLERANCE,
        "ok": code == 0,
    }
    assert ("differs from eager by 0.5" in captured.err) == (code == 1)
