"""The torch-free definition of what a precompile artifact is: msgspec Structs (data only) for the
cache envelope and the python_code metadata, and the codecs that read and write them."""
