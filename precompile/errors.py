"""The one error type of precompile. Torch-free: inspect and schema raise it too."""


class PrecompileError(RuntimeError):
    """A capture, load, or served call violated the precompile contract.

    The message names the file or argument involved, the expected and the actual value, and what to
    do about it.
    """


# The public name users see in tracebacks and docs.
PrecompileError.__module__ = "precompile"


class PrecompileWarning(UserWarning):
    """Something was degraded rather than refused, e.g. an unusable cache ignored at load."""


PrecompileWarning.__module__ = "precompile"
