# Whether the code a capture ran still says what it said at capture (precompile/codegen/drivers/
# source_checks.py, included verbatim in python_code): Dynamo's guards do not check the code it
# inlined, and a MakeFx trace keeps none of the code it ran. Capture hashes the same bytes with the
# same functions (capturing/inlined_files.py); text that moved without changing is the same code, and
# so is text whose tokens are the same (only comments, blank lines or spacing changed).
import hashlib as _hashlib
import importlib as _importlib
import importlib.machinery as _machinery
import inspect as _inspect
import io as _io
import linecache as _linecache
import os as _os
import sys as _sys
import tokenize as _tokenize

if "PrecompileError" not in globals():  # a module of its own, or a MakeFx driver's python_code
    try:
        from precompile.errors import PrecompileError
    except ImportError:  # served where only torch is installed: a twin of the same name

        class PrecompileError(RuntimeError):
            pass


def _refuse(artifact, message, remedy):
    raise PrecompileError(f"{artifact}: {message}; {remedy}")


def hash_source_lines(lines, first_line, last_line):
    return _hashlib.sha256("".join(lines[first_line - 1 : last_line - 1]).encode()).hexdigest()


# Tokens that say only where a line begins, ends or how deep it sits: kept by kind, not by their text.
_LAYOUT_TOKENS = (_tokenize.INDENT, _tokenize.DEDENT, _tokenize.NEWLINE, _tokenize.ENDMARKER)


def code_tokens_sha256(text):
    """The sha256 of the tokens `text` (whole lines of source) holds, leaving out its comments, its
    blank lines and the spacing within and between its lines (an indent counts by its place, not its
    width): two texts with the same tokens parse to the same code, only on other lines. None where the
    text does not tokenize on its own (it begins or ends inside a statement)."""
    digest = _hashlib.sha256()
    try:
        for token in _tokenize.generate_tokens(_io.StringIO(text).readline):
            if token.type in (_tokenize.COMMENT, _tokenize.NL):
                continue
            kind = _tokenize.tok_name[token.type]
            digest.update(f"{kind}\0".encode() if token.type in _LAYOUT_TOKENS else
                          f"{kind} {token.string}\0".encode("utf-8", "surrogatepass"))
    except (_tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
        return None
    return digest.hexdigest()


def _unimported_origin(name):
    """The .py file the import system would load for module `name`, found without executing it or
    its packages; None where it is not a plain source file read by the standard source loader."""
    spec, locations = None, None
    parts = name.split(".")
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        loaded = _sys.modules.get(prefix)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else _machinery.PathFinder.find_spec(prefix, locations)
        if spec is None:
            return None
        locations = spec.submodule_search_locations
    if spec is None:  # a name with no parts
        return None
    origin = spec.origin if spec.has_location else None
    # a real .py file, whichever loader read it (pytest's assertion rewriter loads a plugin's package);
    # a module in a zip archive has no file of its own: its loader reads it
    return origin if origin and origin.endswith(".py") and _os.path.isfile(origin) else None


def source_file(name):
    """The file module `name`'s source is read from: inspect's choice for an imported module, the
    import system's for one not imported yet (found without executing it); None where there is none."""
    loaded = _sys.modules.get(name)
    if loaded is None:
        return _unimported_origin(name)
    path = getattr(loaded, "__file__", None)
    if type(path) is str and path.endswith(".py") and isinstance(getattr(loaded, "__loader__", None), _machinery.SourceFileLoader):
        return path  # what inspect.getsourcefile answers for it, without its lookups
    try:
        return _inspect.getsourcefile(loaded)
    except TypeError:  # a built-in module
        return None


def hash_spans(data, spans):
    """The sha256 of the bytes each [start, end) span of `data` holds, in order (InlinedFile.sha256)."""
    digest = _hashlib.sha256()
    for start, end in spans:
        digest.update(data[start:end])
    return digest.hexdigest()


def _span_bytes(file, start, end):
    """The bytes [start, end) of a file opened unbuffered where they still begin a line and end one (or
    end the file); None otherwise (a short read included: the ranges are then hashed line by line)."""
    before = 1 if start > 0 else 0
    file.seek(start - before)
    chunk = file.read(end - start + before + 1)
    span = chunk[before : before + end - start]
    if len(span) != end - start or (before and chunk[0] != 10):
        return None
    if span and span[-1] != 10 and len(chunk) > before + len(span):  # the span's last line goes on
        return None
    return span


def _is_span(span, size):
    return (type(span) in (list, tuple) and len(span) == 2 and all(type(offset) is int for offset in span)
            and 0 <= span[0] <= span[1] <= size)


def _file_unchanged(path, entry):
    """Whether the file at `path` still has the bytes an INLINED_FILES entry hashed: the spans of its
    inlined ranges and its first two lines (read alone), or the whole file for an entry written before
    spans. The spans' line numbers are not checked: text that moved without changing its bytes or
    offsets is the same code (capture's inlined_files.py says more)."""
    spans = entry.get("spans", ())
    with open(path, "rb", buffering=0) as file:
        if not spans:
            return _hashlib.sha256(file.readall()).hexdigest() == entry["sha256"]
        size = file.seek(0, 2)
        digest = _hashlib.sha256()
        for span in spans:
            data = _span_bytes(file, *span) if _is_span(span, size) else None
            if data is None:
                return False
            digest.update(data)
    return digest.hexdigest() == entry["sha256"]


def _unchanged_modules(metadata):
    """The modules whose source file still has the bytes INLINED_FILES recorded: capture checked each of
    their INLINED_SOURCES ranges against exactly those bytes, so none needs reading again."""
    unchanged = set()
    for entry in metadata.get("INLINED_FILES", ()):
        path = None if entry["module"] == "__main__" else source_file(entry["module"])
        if path is None:
            continue
        try:
            if _file_unchanged(path, entry):
                unchanged.add(entry["module"])
        except OSError:
            pass
    return unchanged


def module_source_lines(name, artifact):
    """Module `name`'s source lines, read as Dynamo's package reads them to hash the code it inlined
    (inspect.getsourcelines of the module, in torch._dynamo.package._hash_sourcelines; a test keeps
    the two equal). A module not imported yet is read from its file, not imported: the polyfills
    Dynamo inlines live in torch._dynamo, which a standalone artifact never imports."""
    origin = None if name in _sys.modules else _unimported_origin(name)
    if origin is not None:
        return _linecache.getlines(origin)
    return _inspect.getsourcelines(_module(name, artifact))[0]


def _check_sources(metadata, artifact, unfound_ok=False):
    """The code the capture ran (Dynamo inlined, a MakeFx trace ran) must still say what it said at
    capture: neither's checks read it. Each module's source is read once, however many of its
    functions were recorded, and not at all where its whole file is unchanged; a function whose text
    now sits at other line numbers (lines added or removed above it) is the same code, and so is one
    whose tokens are the same (a comment, a blank line, a line's spacing changed). `unfound_ok`
    (a MakeFx artifact, which runs none of that code): a module this process cannot find (a capture
    script's, a test's) passes, since no code of it runs here to differ from the graph."""
    unchanged = _unchanged_modules(metadata)
    lines_of, defs_of = {}, {}
    for source in metadata.get("INLINED_SOURCES", ()):
        name = source["module"]
        if name in unchanged or unfound_ok and name not in _sys.modules and _unimported_origin(name) is None:
            continue
        if name not in lines_of:
            try:
                lines_of[name] = module_source_lines(name, artifact)
            except (OSError, TypeError):
                lines_of[name] = None
        lines, first, last = lines_of[name], source["first_line"], source["last_line"]
        if lines is not None and source.get("function") and name not in defs_of:
            defs_of[name] = function_spans(lines)
        if lines is not None and _range_unchanged(lines, source, defs_of.get(name, {})):
            continue
        what = f"{name}.{source['function']} (lines {first}-{last - 1} at capture)" if source.get("function") else \
            f"{name} lines {first}-{last - 1}"
        _refuse(artifact, f"the source of {what} changed since capture (its compiled graphs may no longer match "
                          "it)", "capture the artifact again from the current source")


def _range_unchanged(lines, source, defs):
    """Whether a range's code is still in a module's `lines`. A function (named at capture): where the
    def of its name sits now (`defs`, function_spans), the same one of as many defs of that name as at
    capture (a def added under the same name, which would run instead, is a change), with the same
    text or, where capture hashed them, the same tokens (a comment, a blank line or a line's spacing
    changed only). Code no name finds (a lambda's line): its text on its lines, or at as many places as
    it sat at capture (moved), or its tokens on its lines or at as many places of its length."""
    first, last, sha256, tokens = source["first_line"], source["last_line"], source["sha256"], source.get("token_sha256")
    if source.get("function"):
        spans = defs.get(source["function"], ())
        if len(spans) != 1 + source.get("same_named", 0):
            return False
        span = spans[source.get("place", 0)]
        return hash_source_lines(lines, *span) == sha256 or bool(tokens) and _tokens_at(lines, *span) == tokens
    if hash_source_lines(lines, first, last) == sha256 or bool(tokens) and _tokens_at(lines, first, last) == tokens:
        return True
    length, copies = last - first, source.get("copies", 1)
    starts = range(1, len(lines) - length + 2)
    if sum(hash_source_lines(lines, start, start + length) == sha256 for start in starts) == copies:
        return True
    return bool(tokens) and sum(_tokens_at(lines, start, start + length) == tokens for start in starts) == copies


def _tokens_at(lines, first, last):
    return code_tokens_sha256("".join(lines[first - 1 : last - 1]))


def function_spans(lines):
    """{qualified name (`Block.forward`, `make_act.<locals>.act`): [(first, last) of each def of that name,
    its decorators included, last exclusive, in source order]} of a module's source `lines` (a property's
    getter and setter, an overload, a def in each branch of an `if`, share one); {} where it does not parse."""
    import ast

    try:
        pending: list = [(ast.parse("".join(lines)), "")]
    except (SyntaxError, ValueError):
        return {}
    spans: dict = {}
    while pending:
        node, prefix = pending.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                spans.setdefault(prefix + child.name, []).append((start, (child.end_lineno or child.lineno) + 1))
                pending.append((child, f"{prefix}{child.name}.<locals>."))
            elif isinstance(child, ast.ClassDef):
                pending.append((child, f"{prefix}{child.name}."))
            elif not isinstance(child, ast.Lambda):  # a def inside an if, a try, a with: same scope
                pending.append((child, prefix))
    return {name: sorted(found) for name, found in spans.items()}


def _module(name, artifact):
    if name == "__main__":
        _refuse(artifact, "it captured code defined in __main__, which another process cannot import",
                "define fn in an importable module and capture again")
    try:
        return _importlib.import_module(name)
    except ImportError as exc:
        _refuse(artifact, f"its code lives in module {name!r}, which cannot be imported here ({exc})",
                "serve it where that module is importable")
