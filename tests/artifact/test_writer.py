"""The pair writer across processes: several processes writing one pair at once leave one writer's
pair, whole, and none fails; a writer SIGKILLed at a step of its protocol (between its two commit
renames included) leaves the old pair or the new one, never a mix."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from conftest import ROOT, TESTS
from precompile.artifact.codec import decode_header, encode_cache
from precompile.artifact.pair import declared_code_hash

FIXTURE = ROOT / "fixtures/v1/mlp"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}

# Each writer waits for `go` (bounded), so the processes' writes overlap, then writes its pair `rounds` times.
CONCURRENT_WRITER = r"""
import sys, time
from pathlib import Path
from precompile.artifact.writer import write_pair
artifact, cache, source, rounds = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
python_code, cache_bytes = source.with_suffix(".py").read_bytes(), source.with_suffix(".cache").read_bytes()
source.with_suffix(".ready").touch()
deadline = time.monotonic() + 60
while not (source.parent / "go").exists():
    if time.monotonic() > deadline:
        sys.exit("no go signal within 60 s")
    time.sleep(0.001)
for _ in range(rounds):
    write_pair(artifact, cache, python_code, cache_bytes)
"""

# Writes one pair with the `occurrence`-th call of os.`name` inside the writer replaced by SIGKILL.
KILLED_WRITER = r"""
import os, signal, sys
from pathlib import Path
from precompile.artifact import writer

class KillAt:
    def __init__(self, name, occurrence):
        self.name, self.left = name, occurrence
    def __getattr__(self, attr):
        real = getattr(os, attr)
        if attr != self.name:
            return real
        def call(*args, **kwargs):
            self.left -= 1
            if self.left == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return call

writer.os = KillAt(sys.argv[4], int(sys.argv[5]))
source = Path(sys.argv[3])
writer.write_pair(Path(sys.argv[1]), Path(sys.argv[2]), source.with_suffix(".py").read_bytes(), source.with_suffix(".cache").read_bytes())
"""


def variant(directory: Path, tag: str) -> Path:
    """A loadable pair distinct per tag (the mlp fixture, its python_code tagged by a comment),
    staged as directory/tag.py and directory/tag.cache; returns directory/tag."""
    python_code = FIXTURE.with_suffix(".py").read_bytes() + f"# writer {tag}\n".encode()
    envelope, _ = decode_header(FIXTURE.with_suffix(".cache").read_bytes())
    envelope = msgspec.structs.replace(envelope, code_hash=hashlib.sha256(python_code).hexdigest())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{tag}.py").write_bytes(python_code)
    (directory / f"{tag}.cache").write_bytes(encode_cache(envelope))
    return directory / tag


def whose(artifact: Path, cache: Path, sources: list[Path]) -> Path | None:
    """The staged source whose pair is on disk, whole, or None for a mix or anything else."""
    on_disk = (artifact.read_bytes(), cache.read_bytes())
    for source in sources:
        if on_disk == (source.with_suffix(".py").read_bytes(), source.with_suffix(".cache").read_bytes()):
            return source
    return None


def wait_for(paths: list[Path], processes: list[subprocess.Popen], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        if any(process.poll() is not None for process in processes) or time.monotonic() > deadline:
            for process in processes:
                process.kill()
            pytest.fail(f"writers did not all start: {[process.communicate()[1] for process in processes]}")
        time.sleep(0.01)


@pytest.mark.parametrize("writers", [2, 5])
def test_concurrent_writers_leave_one_writers_pair_whole(tmp_path, writers):
    out = tmp_path / "out"
    artifact, cache = out / "m.py", out / "m.cache"
    sources = [variant(tmp_path / "staged", f"w{i}") for i in range(writers)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_WRITER, str(artifact), str(cache), str(source), "20"],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for source in sources
    ]
    wait_for([source.with_suffix(".ready") for source in sources], processes)
    (tmp_path / "staged/go").touch()
    for process in processes:
        try:
            _, stderr = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            pytest.fail("a writer did not finish within 120 s")
        assert process.returncode == 0, stderr
    assert whose(artifact, cache, sources) is not None
    assert sorted(p.name for p in out.iterdir()) == ["m.cache", "m.py"]  # no temporary, pending cache or lock left


def test_a_failed_write_under_the_lock_removes_the_pending_cache_and_the_lock(tmp_path, monkeypatch):
    import precompile.artifact.writer as writer
    from precompile import PrecompileError

    old, new = variant(tmp_path / "staged", "old"), variant(tmp_path / "staged", "new")
    artifact, cache = tmp_path / "out/m.py", tmp_path / "out/m.cache"
    writer.write_pair(artifact, cache, old.with_suffix(".py").read_bytes(), old.with_suffix(".cache").read_bytes())
    real_replace = os.replace

    def refuse_the_cache(src, dst):
        if Path(dst) == cache:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(writer.os, "replace", refuse_the_cache)
    with pytest.raises(PrecompileError, match=r"could not write the artifact pair .*No space left on device.*previous pair"):
        writer.write_pair(artifact, cache, new.with_suffix(".py").read_bytes(), new.with_suffix(".cache").read_bytes())
    monkeypatch.undo()
    assert whose(artifact, cache, [old]) == old
    assert sorted(p.name for p in artifact.parent.iterdir()) == ["m.cache", "m.py"]


def test_a_lock_held_too_long_is_a_clear_error_and_changes_nothing(tmp_path, monkeypatch):
    import precompile.artifact.writer as writer
    from precompile import PrecompileError

    old, new = variant(tmp_path / "staged", "old"), variant(tmp_path / "staged", "new")
    artifact, cache = tmp_path / "out/m.py", tmp_path / "out/m.cache"
    writer.write_pair(artifact, cache, old.with_suffix(".py").read_bytes(), old.with_suffix(".cache").read_bytes())
    monkeypatch.setattr(writer, "LOCK_TIMEOUT_S", 0.2)
    with writer.pair_lock(cache):  # a second open file description: flock excludes it like another process
        with pytest.raises(PrecompileError, match=r"could not write .*another process has held the lock .*\.m\.cache\.lock .*wait for the process saving this pair"):
            writer.write_pair(artifact, cache, new.with_suffix(".py").read_bytes(), new.with_suffix(".cache").read_bytes())
    assert whose(artifact, cache, [old]) == old
    assert sorted(p.name for p in artifact.parent.iterdir()) == ["m.cache", "m.py"]


# Where write_pair over an existing pair is killed: (os function, its occurrence in the writer),
# and which pair a load then finds.
KILL_POINTS = {
    "writing its temporaries": ("fsync", 1, "old"),
    "holding the lock, before any rename": ("replace", 1, "old"),
    "after placing <cache>.pending, before the commit": ("replace", 2, "old"),
    "between the two commit renames": ("replace", 3, "new"),
    "after both renames, before releasing the lock": ("unlink", 1, "new"),
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_a_writer_killed_at_any_step_leaves_the_old_pair_or_the_new_one(tmp_path, point):
    import precompile

    staged = tmp_path / "staged"
    old, new, later = variant(staged, "old"), variant(staged, "new"), variant(staged, "later")
    artifact, cache = tmp_path / "out/m.py", tmp_path / "out/m.cache"
    from precompile.artifact.writer import write_pair

    write_pair(artifact, cache, old.with_suffix(".py").read_bytes(), old.with_suffix(".cache").read_bytes())
    name, occurrence, survivor = KILL_POINTS[point]
    child = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(artifact), str(cache), str(new), name, str(occurrence)],
        env=ENV, capture_output=True, text=True, timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr  # the kill point was reached

    pending = cache.with_name("m.cache.pending")
    if point == "between the two commit renames":
        # new python_code, old cache, new cache pending: load finishes the write
        assert artifact.read_bytes() == new.with_suffix(".py").read_bytes() and pending.exists()
        assert declared_code_hash(pending.read_bytes()) == hashlib.sha256(artifact.read_bytes()).hexdigest()
    else:
        assert whose(artifact, cache, [old, new]) is not None
    precompile.load(artifact, cache)
    assert whose(artifact, cache, [old, new]) == {"old": old, "new": new}[survivor]

    # the next writer settles whatever the killed one left and writes a whole pair
    write_pair(artifact, cache, later.with_suffix(".py").read_bytes(), later.with_suffix(".cache").read_bytes())
    assert whose(artifact, cache, [later]) == later and not pending.exists()
    precompile.load(artifact, cache)


def test_a_fifo_at_the_artifact_path_beside_a_pending_cache_is_refused_not_read(tmp_path):
    """Finishing an interrupted write reads the artifact at its path with the bounded regular-file
    reader (issue 38, finding 5): a FIFO there is refused at once (reading it would block forever)."""
    from precompile.artifact.pair import pending_path

    code = r"""
import sys
from pathlib import Path
from precompile import PrecompileError
from precompile.artifact.writer import write_pair
artifact, cache, source = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
try:
    write_pair(artifact, cache, source.with_suffix(".py").read_bytes(), source.with_suffix(".cache").read_bytes())
except PrecompileError as exc:
    print(exc)
"""
    artifact, cache = tmp_path / "out/m.py", tmp_path / "out/m.cache"
    artifact.parent.mkdir()
    os.mkfifo(artifact)
    pending_path(cache).write_bytes(FIXTURE.with_suffix(".cache").read_bytes())
    proc = subprocess.run([sys.executable, "-c", code, str(artifact), str(cache), str(FIXTURE)], env=ENV,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "is not a regular file (it is a FIFO)" in proc.stdout and str(artifact) in proc.stdout
