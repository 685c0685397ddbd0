"""A URL in any form a local path takes, fetched and given back as the same form of a local path.

What the verbs accept locally (a directory holding one pair, a prefix DIR/NAME, a file of a pair or a
file alone; inspect/reading/reader.py resolves them) works at a URL too, by listing and asking the store what
exists: the files found are fetched (fetch_cache.py) into one view directory, and the verb reads the
matching local form there. `load` fetches the two URLs it is given (and the .sig beside them).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

from precompile.artifact.codec import MAX_HEADER_SIZE, MAX_PAYLOAD_SIZE, PREFIX_SIZE
from precompile.artifact.pycode import MAX_PYTHON_CODE_SIZE
from precompile.errors import PrecompileError
from precompile.storage import fetch_cache, remote
from precompile.storage.locations import parent_and_name, redacted, redacting, shown

MAX_CACHE_SIZE = PREFIX_SIZE + MAX_HEADER_SIZE + MAX_PAYLOAD_SIZE
MAX_SIGNATURE_SIZE = 1024 * 1024
SUFFIXES = (".py", ".cache", ".sig")


@dataclass(frozen=True)
class Staged:
    local: str
    """The local path of the same form as the URL given (a directory, a prefix or a file in `view`)."""
    view: Path
    parent_url: str
    """The URL of the directory the files came from, which `view` stands for in what is printed (redacted:
    locations.redacted)."""


def _limit(name: str) -> tuple[str, int]:
    if name.endswith(".py"):
        return "python_code", MAX_PYTHON_CODE_SIZE
    if name.endswith(".sig"):
        return "signature", MAX_SIGNATURE_SIZE
    return "cache", MAX_CACHE_SIZE


def _fetched_view(parent: str, names: list[str]) -> Path:
    files = {}
    for name in names:
        what, limit = _limit(name)
        files[name] = fetch_cache.fetch(f"{parent}/{name}", what, limit)
    return fetch_cache.view(files)


def _pair_names(parent: str, stem: str, *, required: tuple[str, ...]) -> list[str]:
    """NAME.py, NAME.cache and NAME.sig that exist at `parent` (those in `required` fetched regardless,
    so that a missing one is named by the fetch)."""
    return [f"{stem}{suffix}" for suffix in SUFFIXES if f"{stem}{suffix}" in required or remote.exists(f"{parent}/{stem}{suffix}")]


@redacting
def stage(url: str) -> Staged:
    """Fetch what `url` names as a verb's artifact argument: a directory holding one pair, a file (with
    the rest of its pair, where it exists beside it), or a prefix NAME of NAME.py."""
    url = shown(url).rstrip("/")
    names = remote.listing(url)
    if names is not None:
        stems = sorted(n[:-3] for n in names if n.endswith(".py") and f"{n[:-3]}.cache" in names)
        if len(stems) != 1:
            raise PrecompileError(f"directory {url} must hold exactly one pair NAME.py + NAME.cache (found: "
                                  f"{', '.join(stems) or 'none'}); pass the two files or the prefix DIR/NAME instead")
        view = _fetched_view(url, [n for n in names if n in {f"{stems[0]}{s}" for s in SUFFIXES}])
        return Staged(local=str(view), view=view, parent_url=redacted(url))
    parent, name = parent_and_name(url)
    if remote.exists(url):
        stem, suffix = (name.rsplit(".", 1)[0], "." + name.rsplit(".", 1)[1]) if "." in name else (name, "")
        names_found = _pair_names(parent, stem, required=(name,)) if suffix in (".py", ".cache") else [name]
        view = _fetched_view(parent, names_found)
        return Staged(local=str(view / name), view=view, parent_url=redacted(parent))
    if remote.exists(f"{url}.py"):
        view = _fetched_view(parent, _pair_names(parent, name, required=(f"{name}.py",)))
        return Staged(local=str(view / name), view=view, parent_url=redacted(parent))
    if name.endswith((".py", ".cache")):  # a file of a pair, named as such: the store has no such object
        raise PrecompileError(f"{_limit(name)[0]} {url} does not exist; pass the URL of the file capture() wrote")
    raise PrecompileError(f"{url} is neither a directory with one pair, a python_code file, nor a prefix of {url}.py; "
                          "pass PYTHON_CODE CACHE, a directory holding one pair, or a prefix DIR/NAME")


@dataclass(frozen=True)
class FetchedPair:
    python_code: fetch_cache.Fetched
    cache: fetch_cache.Fetched | None
    """None where the cache URL names nothing (load then serves from python_code alone, as locally)."""
    python_code_path: Path
    cache_path: Path
    """The two in a view directory, beside the pair's .sig where the store holds one."""
    urls: dict[str, str]
    """Each file in the view directory by the URL it was fetched from, redacted (locations.redacted)."""

    def named(self, text: str) -> str:
        """`text` naming the URLs where it names the files in the view directory."""
        for local, url in self.urls.items():
            text = text.replace(local, url)
        return text


@redacting
def fetch_pair(python_code_url: str, cache_url: str) -> FetchedPair:
    """load's two files (and the .sig beside python_code, where there is one), fetched: python_code must
    exist; a missing cache is left for load to judge, as locally."""
    code_parent, code_name = parent_and_name(shown(python_code_url))
    _, cache_name = parent_and_name(shown(cache_url))
    code = fetch_cache.fetch(python_code_url, "python_code", MAX_PYTHON_CODE_SIZE)
    files = {code_name: code}
    cache = fetch_cache.fetch_if_present(cache_url, "cache", MAX_CACHE_SIZE)
    if cache is not None:
        files[cache_name if cache_name != code_name else f"{cache_name}.cache"] = cache
    signature_name = f"{code_name.rsplit('.', 1)[0] if '.' in code_name else code_name}.sig"
    if signature_name not in files:
        # A signature the store cannot be asked about and the cache holds no copy of is taken as absent:
        # a load that pins keys then refuses the pair as unsigned (fail closed), one that pins none never reads it.
        with contextlib.suppress(remote.Unreachable):
            signature = fetch_cache.fetch_if_present(f"{code_parent}/{signature_name}", "signature", MAX_SIGNATURE_SIZE)
            files.update({signature_name: signature} if signature is not None else {})
    view = fetch_cache.view(files)
    cache_in_view = next((name for name, f in files.items() if f is cache), cache_name)
    return FetchedPair(python_code=code, cache=cache, python_code_path=view / code_name, cache_path=view / cache_in_view,
                       urls={str(view / name): redacted(f.url) for name, f in files.items()} | {str(view / cache_in_view): redacted(cache_url)})
