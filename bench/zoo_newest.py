"""The zoo against the model libraries' newest releases: which are newer than the pins, and what broke.

The test suite installs the versions `constraints.txt` (and pyproject's `zoo` extra) pin, so an
upstream release cannot break CI unseen. This is where a new release is seen: `./dev zoo-newest`
builds `./.venv-newest` with torch 2.13.0 and the newest transformers, diffusers, timm (and what they
pull in), then runs this, which prints each model library's installed version beside its pin, runs the
zoo (eager backend, load-after, one serving process per cell unless ARGS say otherwise) and ends with
the cells that failed, each with its error. Exit 1 when a cell failed: raise the pin only after the
failures are fixed or documented.

    ./dev zoo-newest [bench/zoo.py ARGS]
"""
from __future__ import annotations

import json
import re
import sys
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("transformers", "diffusers", "timm", "torchvision", "tokenizers", "huggingface_hub", "safetensors", "kernels")
DEFAULTS = ["--backends", "eager", "--orders", "load-after", "--serve-runs", "1"]


def pins() -> dict[str, str]:
    """Each pinned distribution's version: constraints.txt, then pyproject's `name==version` lines."""
    pinned: dict[str, str] = {}
    for text in ((ROOT / "constraints.txt").read_text(), (ROOT / "pyproject.toml").read_text()):
        for name, version in re.findall(r'^\s*"?([A-Za-z0-9_.-]+)==([^\s",]+)', text, re.MULTILINE):
            pinned.setdefault(_normal(name), version)
    return pinned


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def versions_against_pins() -> list[tuple[str, str | None, str | None]]:
    """(library, installed or None, pinned or None) for each model library."""
    pinned = pins()
    rows = []
    for library in LIBRARIES:
        try:
            installed: str | None = metadata.version(library)
        except metadata.PackageNotFoundError:
            installed = None
        rows.append((library, installed, pinned.get(_normal(library))))
    return rows


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from bench import zoo

    print("model libraries, installed against pinned:")
    for library, installed, pinned in versions_against_pins():
        state = ("not installed" if installed is None else "as pinned" if installed == pinned
             else "not pinned" if pinned is None else f"pinned {pinned}")
        print(f"  {library:16} {installed or '-':12} {state}")
    args = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as scratch:
        rows_json = Path(args[args.index("--json") + 1]) if "--json" in args else Path(scratch) / "zoo.json"
        exit_code = zoo.main([*DEFAULTS, *args] + ([] if "--json" in args else ["--json", str(rows_json)]))
        rows = json.loads(rows_json.read_text())
    broke = [row for row in rows if "skipped" not in row and not zoo.passed(row)]
    print("\nwhat broke against the newest releases:" if broke else "\nnothing broke against the newest releases")
    for row in broke:
        print(f"  {row['model']} {row['tracer']} {row['backend']}: {row.get('error') or 'max diff %s' % row.get('max_diff')}")
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
