"""The version of this precompile, recorded in every cache it writes."""

__version__ = "0.1.0"
