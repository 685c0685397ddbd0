"""Where an artifact lives: a local path or an fsspec URL, and the local content-addressed cache that
remote files are fetched into. Torch-free; `inspect/` and `serve/` open artifacts through it, and
nothing below them knows about URLs."""
