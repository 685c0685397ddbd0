"""The fields of a Mega-Cache entry torch runs as code, read from the state its pickle's BUILDs set
(`pickle_scan.scan_pickle` with `states`; never unpickled), each judged against what torch itself
writes there.

torch 2.11-2.14 build `CompiledFxGraph` (Inductor entries, and inline in AOTAutograd's bundled
results) and the AOTAutograd results as dataclasses: an empty object, then a BUILD of their fields
(`mega_cache_policy` allows them in no other shape). Of those fields torch runs:

- `guards_expr`: `eval`'d when the entry is looked up (FxGraphCache and AOTAutogradCache), before its
  code: a finding unless it is a guard expression torch writes (`guard_expressions`).
- `output_strides`: each text `eval`'d at load (`set_tracing_context_output_strides`): a finding
  unless it is a stride expression torch writes.
- `cache_key` with `source_code`: load writes `source_code` to `<inductor cache>/<cache_key[1:3]>/
  <cache_key>.py` (unless a file is there already) and imports that file; torch computes the key as
  its code hash of the stripped source (`"c"` + 51 base32 characters of sha256), so any other key is
  a finding: it sends the module to another path (an absolute one anywhere), or imports a file
  already there instead of the source shown. The source itself is shown as an output module.

A state the reader cannot follow in an entry whose classes are reviewed (a state that is no dict,
a field named by no literal) could set any of them: a finding too. torch's own fields are shown:
a guard expression always, an output stride when it is not a plain number, the module's file.
"""
from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable

from precompile.artifact.pickle_machine import BuildState
from precompile.artifact.pickle_symbols import summarize
from precompile.inspect.formats.guard_expressions import refusal
from precompile.inspect.formats.mega_cache_policy import REVIEWED
from precompile.inspect.model.artifact import MegaCacheEntry, MegaCacheRun

MAX_SHOWN = 2000
"""Characters of a field's text kept in the report; a longer one is cut, giving its length."""


def code_hash(source: str) -> str:
    """torch's key for a Python module it writes (`codecache.code_hash` of the stripped source)."""
    digest = hashlib.sha256(source.strip().encode("utf-8", "surrogatepass")).digest()
    return "c" + base64.b32encode(digest)[:51].decode("ascii").lower()


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text)} characters)"


def _text(value) -> str:
    return _cut(value) if isinstance(value, str) else summarize(value)


def _parts(state) -> list[dict] | None:
    """The dicts a BUILD sets fields from (a dict, or a (dict, slot dict) pair, either may be None);
    None when the state is neither."""
    if isinstance(state, dict):
        return [state]
    if isinstance(state, tuple) and len(state) == 2 and all(part is None or isinstance(part, dict) for part in state):
        return [part for part in state if part]
    return None


def _guards(value, run) -> list[MegaCacheRun]:
    if value is None:
        return []
    if not isinstance(value, str):
        return [run("guards_expr", value, "not a string: torch writes a guard expression or None")]
    why = refusal(value, "sources")
    return [run("guards_expr", value, f"not a guard expression torch writes: {why}" if why else None)]


def _strides(value, run) -> list[MegaCacheRun]:
    if value is None:
        return []
    if not isinstance(value, list):
        return [run("output_strides", value, "not a list: torch writes a list of tuples of stride texts or None")]
    found = []
    for i, strides in enumerate(value):
        if strides is None:
            continue
        if not isinstance(strides, tuple):
            found.append(run(f"output_strides[{i}]", strides, "not a tuple: torch writes a tuple of stride texts or None"))
            continue
        for j, stride in enumerate(strides):
            if not isinstance(stride, str):
                found.append(run(f"output_strides[{i}][{j}]", stride, "not a string: torch writes a stride expression"))
            elif not stride.isdigit():
                why = refusal(stride, "names")
                found.append(run(f"output_strides[{i}][{j}]", stride, f"not a stride expression torch writes: {why}" if why else None))
    return found


def _module(fields: dict, run) -> list[MegaCacheRun]:
    key, source = fields.get("cache_key"), fields.get("source_code")
    if not isinstance(source, str):
        return [run("source_code", source, "not a string beside a cache_key: torch writes the output module's text")]
    if not isinstance(key, str):
        return [run("cache_key", key, "not a string beside a source_code: torch writes the module's code hash")]
    expected = code_hash(source)
    if key != expected:
        return [run("cache_key", key, f"not torch's hash of the source_code beside it ({expected}): load would write or "
                                      "import the module at a path of its choosing, not the source shown")]
    return [run("cache_key", f"<inductor cache>/{key[1:3]}/{key}.py", None)]


def _unreadable(state: BuildState, parts: list[dict] | None, reviewed: bool, run) -> list[MegaCacheRun]:
    if not reviewed:
        return []  # every class of an unreviewed kind is a finding already
    if parts is None:
        return [run("(state)", state.state, "a BUILD state that is no dict: it could set any field torch runs")]
    odd = [key for part in parts for key in part if not isinstance(key, str)]
    return [run("(state)", odd[0], "a field named by no literal string: it could be any field torch runs")] if odd else []


def entry_runs(states: Iterable[BuildState], kind: str) -> tuple[tuple[MegaCacheRun, ...], tuple[str, ...]]:
    """What an entry's BUILDs set that torch runs, each judged, and the output modules' sources (to be
    shown as code whatever they hold)."""
    runs: list[MegaCacheRun] = []
    modules: list[str] = []
    for state in states:
        def run(field: str, value, problem: str | None, state: BuildState = state) -> MegaCacheRun:
            return MegaCacheRun(field=field, offset=state.offset, within=state.within, text=_text(value), problem=problem)

        parts = _parts(state.state)
        runs += _unreadable(state, parts, kind in REVIEWED, run)
        for fields in parts or ():
            runs += _guards(fields.get("guards_expr"), run) + _strides(fields.get("output_strides"), run)
            if "cache_key" in fields or "source_code" in fields:
                runs += _module(fields, run)
                modules += [fields["source_code"]] if isinstance(fields.get("source_code"), str) else []
    return tuple(runs), tuple(modules)


def run_finding(entry: MegaCacheEntry, run: MegaCacheRun) -> str:
    """One finding: the entry, the field, where its BUILD is, why, and the text torch would run."""
    where = f"opcode offset {run.offset}" + (f" in the {run.within}" if run.within else "")
    return f"Mega-Cache {entry.kind} {entry.key}: {run.field} (set at {where}) is {run.problem}; it holds: {run.text}"
