"""The artifact as it lies on disk, torch-free: the cache envelope and its codec, the python_code
metadata and its literal reader, the rules a kernel bundle obeys, and the pair's reader and writer.

Capture writes through it, load and inspect read through it: one definition of what an artifact is.
"""
