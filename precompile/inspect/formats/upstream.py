"""Upstream torch's own precompile artifacts (`torch.compiler.precompile`, torch 2.14+), read statically.

python_code: a MakeFx capture whose calling convention is a set of top-level literals (BACKEND,
PARAM_NAMES, USER_INPUT_SHAPES, IN_SPEC, OUT_SPEC, ...) and which has no FORMAT_VERSION.
cache: a torch.save zip whose `data.pkl` is the plain dict {format: "torch.compiler.precompile",
version, backend, code_hash: sha256 of python_code, artifact: Mega-Cache bytes or None}, and from
torch 2.15 on a `tracer` field (and, for a capture other than make_fx, a TRACER literal in
python_code; either absent reads as make_fx); the format version stays 1. The dict is read with
`pickle_values` (literals only, nothing imported or called) and its `artifact` decoded by
`mega_cache`. Pairing is upstream's own rule: the backend and tracer tags agree and code_hash is the
sha256 of the python_code bytes.
"""
from __future__ import annotations

from precompile.artifact.pycode import NotALiteral
from precompile.inspect.formats.mega_cache import read_mega_cache
from precompile.inspect.formats.pickle_values import PickleValueError, pickle_value
from precompile.inspect.model.artifact import NamedValue, UpstreamCodeInfo, UpstreamPrecompile

CACHE_FORMAT = "torch.compiler.precompile"
CACHE_VERSION = 1
# What upstream's loader (`_parse_artifact_metadata`) requires; a file holding these and no
# FORMAT_VERSION is upstream's python_code.
CALLING_CONVENTION = (
    "BACKEND", "MODULE_POSITIONS", "NUM_POSITIONAL_ARGS", "PARAM_NAMES", "BUFFER_NAMES", "PARAM_SHAPES",
    "BUFFER_SHAPES", "PARAM_DTYPES", "BUFFER_DTYPES", "PARAM_DEVICES", "BUFFER_DEVICES", "GRAD_PARAM_INDICES",
    "IN_SPEC", "OUT_SPEC", "USER_INPUT_SHAPES", "USER_INPUT_DTYPES", "USER_INPUT_DEVICES", "USER_INPUT_BOUNDS",
)
_RECOGNISED_BY = ("BACKEND", "PARAM_NAMES", "USER_INPUT_SHAPES", "IN_SPEC", "OUT_SPEC")
DEFAULT_TRACER = "make_fx"
"""What upstream's load reads an absent TRACER literal or `tracer` field as (torch 2.14 wrote neither)."""


def _text(value) -> str:
    if isinstance(value, NotALiteral):
        return f"(not a literal, line {value.lineno})"
    return repr(value)


def upstream_code(values: dict) -> UpstreamCodeInfo | None:
    """The upstream metadata of a python_code's top-level literals, or None when it is not upstream's."""
    if "FORMAT_VERSION" in values or not all(name in values for name in _RECOGNISED_BY):
        return None
    backend, tracer = values.get("BACKEND"), values.get("TRACER", DEFAULT_TRACER)
    return UpstreamCodeInfo(
        backend=backend if isinstance(backend, str) else None,
        tracer=tracer if isinstance(tracer, str) else None,
        literals=tuple(NamedValue(name=name, value=_text(values[name]))
                       for name in (*CALLING_CONVENTION, "TRACER") if name in values),
    )


def missing_literals(info: UpstreamCodeInfo) -> tuple[str, ...]:
    """Calling-convention literals upstream's loader requires that this python_code lacks."""
    present = {literal.name for literal in info.literals}
    return tuple(name for name in CALLING_CONVENTION if name not in present)


def upstream_envelope(data_pkl: bytes, *, where: str) -> UpstreamPrecompile | None:
    """The envelope in an upstream cache's data.pkl, or None when the pickle is not one."""
    try:
        value = pickle_value(data_pkl)
    except PickleValueError:
        return None
    if not isinstance(value, dict) or value.get("format") != CACHE_FORMAT:
        return None
    version, backend, code_hash, artifact = (value.get(k) for k in ("version", "backend", "code_hash", "artifact"))
    tracer = value.get("tracer")
    return UpstreamPrecompile(
        format=CACHE_FORMAT,
        version=version if isinstance(version, int) and not isinstance(version, bool) else None,
        backend=backend if isinstance(backend, str) else None,
        tracer=tracer if isinstance(tracer, str) else None,
        code_hash=code_hash if isinstance(code_hash, str) else None,
        artifact=read_mega_cache(artifact, where=f"{where} field artifact") if isinstance(artifact, bytes) else None,
    )


def envelope_problem(envelope: UpstreamPrecompile, path: str) -> str | None:
    """Why this envelope cannot be read as this reader understands it, or None."""
    if envelope.version != CACHE_VERSION:
        return (f"cache {path} is an upstream torch.compiler.precompile cache of version {envelope.version}, "
                f"this reader understands version {CACHE_VERSION}; inspect it with a newer precompile")
    return envelope.artifact.problem if envelope.artifact is not None else None


def upstream_pairing_problem(digest: str, code: UpstreamCodeInfo, envelope: UpstreamPrecompile) -> str | None:
    """Why this upstream cache does not belong to the upstream python_code whose sha256 is `digest`
    (upstream's load refuses such a pair), or None."""
    if envelope.backend != code.backend:
        return f"the cache's backend {envelope.backend!r} does not match the python_code BACKEND {code.backend!r}"
    if (envelope.tracer or DEFAULT_TRACER) != code.tracer:
        return (f"the cache's tracer {envelope.tracer or DEFAULT_TRACER!r} does not match the python_code TRACER "
                f"{code.tracer!r}")
    if envelope.code_hash != digest:
        return f"the cache's code_hash {envelope.code_hash} does not match sha256(python_code) {digest}"
    return None
